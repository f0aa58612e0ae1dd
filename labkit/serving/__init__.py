"""Serving many users, in three parts that import in one direction (studies -> engine, http -> engine):

- `labkit.serving.engine`: requests, the scheduler's batching policies, the engine over a packed paged KV
  cache, speculation inside its passes and the budgets that size it, the engine on its own thread.
- `labkit.serving.http`: `labkit serve`, the engine behind an OpenAI-compatible HTTP API (imported on its own).
- `labkit.serving.studies`: the engine on seeded traces, simulated pass times, recorded replies, replicas,
  disaggregated prefill and two processes (`labkit.serving.studies.parallel`, imported on its own).

This package hands on the names chapter 09 uses most.
"""
from labkit.serving import studies
from labkit.serving.engine import POLICIES, Engine, Replay, Request, Scheduler, Status, Step
from labkit.serving.studies import ROUTERS, Router, fresh, percentile, poisson_trace, replay_replicas, summarize

__all__ = ["Engine", "Replay", "Step", "Request", "Status", "Scheduler", "POLICIES", "poisson_trace", "summarize",
           "percentile", "fresh", "Router", "ROUTERS", "replay_replicas", "studies"]
