"""Serving many users: requests (`request`), batching policies (`scheduler`), the engine over a packed
paged KV cache (`engine`), seeded traces and their metrics (`trace`), routing requests across data-parallel
replicas (`router`), speculation inside the engine (`speculate`: drafts verified in the packed pass, rolled back in
the paged store; `budget`: how many drafted tokens each request verifies per pass), an OpenAI-style HTTP endpoint
(`server`), tensor / data parallelism and prefill-decode disaggregation on two processes (`parallel`), and
disaggregated prefill replayed on a prefill engine and a decode engine, the KV cache moved between (`disagg`).

`labkit.serving.parallel` is imported on its own (it starts processes)."""
from labkit.serving.engine import Engine, Replay, Step
from labkit.serving.request import Request, Status
from labkit.serving.router import ROUTERS, Router, replay_replicas
from labkit.serving.scheduler import POLICIES, Scheduler
from labkit.serving.trace import fresh, percentile, poisson_trace, summarize
from labkit.serving import studies

__all__ = ["Engine", "Replay", "Step", "Request", "Status", "Scheduler", "POLICIES", "poisson_trace", "summarize",
           "percentile", "fresh", "Router", "ROUTERS", "replay_replicas"]
