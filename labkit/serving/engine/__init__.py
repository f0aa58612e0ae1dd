"""The serving engine: requests in, batched passes over a paged KV cache, tokens out.

- `request`: `Request` (its tokens, what is cached, the times of its life) and `Status`.
- `scheduler`: `Scheduler`, which requests run in the next pass and how many of their tokens (`POLICIES`).
- `loop`: `Engine` (a scheduler, a packed paged KV cache and a model stepping together) and `run_trace`.
- `steps`: what the engine records: `Step` (one pass, with the split of its work), `Replay`, `PassFailed`.
- `speculate` and `budget`: drafts verified in the engine's packed pass (`Speculator`) and how many each
  request may carry per pass (`spec_budget`: off, fixed, vLLM's batch cap, load-aware).
- `runtime`: `EngineThread`, the engine on a thread of its own (aborts, deadlines, failures contained).

The engine imports neither `labkit.serving.http` nor `labkit.serving.studies`; both import it.
"""
from labkit.serving.engine.budget import GAMMA_LIMIT, BatchCap, Fixed, LoadAware, Off, SpecBudget, spec_budget
from labkit.serving.engine.loop import Engine, run_trace
from labkit.serving.engine.request import Request, Status
from labkit.serving.engine.runtime import EngineThread, Overloaded
from labkit.serving.engine.scheduler import POLICIES, Scheduler
from labkit.serving.engine.speculate import Speculator
from labkit.serving.engine.steps import PassFailed, Replay, Step

__all__ = ["Engine", "run_trace", "Request", "Status", "Scheduler", "POLICIES", "Step", "Replay", "PassFailed",
           "EngineThread", "Overloaded", "Speculator", "SpecBudget", "Off", "Fixed", "BatchCap", "LoadAware",
           "spec_budget", "GAMMA_LIMIT"]
