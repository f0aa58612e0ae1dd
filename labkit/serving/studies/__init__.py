"""Studies: the engine run on recorded, simulated or parallel work, for chapter 09 and `labkit bench`.

- `sweeps`: `batch_sweep`, `prefill_interference`, `shared_prefix`, `routing`, `simulate` (a trace through the
  real scheduler with modelled pass times) and `disaggregation`.
- `trace`: seeded workloads and the numbers a serving system is judged by (`poisson_trace`, `summarize`,
  `percentile`, `fresh`).
- `router`: data-parallel replicas (`Router`, `ROUTERS`, `replay_replicas`).
- `disagg`: prefill on one engine, decoding on another, the KV cache sent between (`replay_disaggregated`).
- `passcost`: what one pass costs on this machine by the tokens in it (`measure_pass_costs`, `step_time`).
- `recorded` and `specload`: speculation under load, a workload recorded once and replayed with each budget
  (`RecordedModel`; `labkit.serving.studies.specload`).
- `parallel`: tensor and data parallelism and disaggregation on two processes (imported on its own: it starts
  processes; `_dist` is its plumbing).

Studies import the engine; the engine never imports them.
"""
from labkit.serving.studies.disagg import Transfer, replay_disaggregated
from labkit.serving.studies.passcost import measure_pass_costs, step_time
from labkit.serving.studies.recorded import RecordedModel
from labkit.serving.studies.router import ROUTERS, Router, replay_replicas, request_work
from labkit.serving.studies.sweeps import (batch_sweep, disaggregation, prefill_interference, routing, shared_prefix,
                                           simulate)
from labkit.serving.studies.trace import fresh, percentile, poisson_trace, summarize

__all__ = ["batch_sweep", "prefill_interference", "shared_prefix", "routing", "simulate", "disaggregation",
           "poisson_trace", "summarize", "percentile", "fresh", "Router", "ROUTERS", "replay_replicas",
           "request_work", "replay_disaggregated", "Transfer", "measure_pass_costs", "step_time", "RecordedModel"]
