"""The plumbing under `labkit.serving.studies.parallel`: start ranks, load a model by name, decode greedily.

`launch(worker, world, args)` starts `world` processes with `torch.multiprocessing`'s spawn
context (a fresh interpreter each: no forked threads, no shared state), joins them into one
`torch.distributed` group over gloo on a free port of 127.0.0.1, runs
`worker(rank, world, *args)` in each and hands back the per-rank results, in rank order.
Every rank runs on one thread (`torch.set_num_threads(1)`): two processes on two cores,
rather than four threads fighting over them. Results and tracebacks come back through an
`mp.Queue`; a rank that fails, dies or outlives `timeout_s` raises in the parent, and no
process is left behind.

Spawned ranks import the worker by its module path, so workers live at module top level;
a script that calls `launch` must guard its own code with `if __name__ == "__main__":`.
"""
from __future__ import annotations

import queue as queue_module
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from labkit import checks
from labkit.measure.clock import now as clock_now
from labkit.data import paths

__all__ = ["launch", "free_port", "load_named", "model_names", "check_request", "prefill_last", "decode_greedy"]

SMOLLM2 = "smollm2-135m"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nobody listens on now (the OS picks one for port 0).

    The socket is closed before the ranks bind it: another program could take the port in
    between; on a lab machine that race is harmless.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(worker, rank: int, world: int, port: int, args: tuple, timeout_s: float, results) -> None:
    """One rank: join the group, run the worker, report `(rank, ok, result or traceback)`."""
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        try:
            out = worker(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, with its traceback
        results.put((rank, False, traceback.format_exc()))


def launch(worker, world: int, args: tuple = (), timeout_s: float = 120.0) -> list:
    """Run `worker(rank, world, *args)` on `world` spawned ranks; their results, rank 0 first.

    Raises RuntimeError with the child's traceback when a rank fails (or dies without a
    word), TimeoutError when the ranks are not all done after `timeout_s` seconds.
    """
    checks.positive_int("world", world)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(worker, r, world, port, args, timeout_s, results), daemon=True)
             for r in range(world)]
    deadline = time.monotonic() + timeout_s
    done: dict[int, object] = {}
    try:
        for p in procs:
            p.start()
        while len(done) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(done))
                raise TimeoutError(f"ranks {missing} of {world} did not finish {worker.__name__} in {timeout_s:g} s")
            try:
                rank, ok, payload = results.get(timeout=min(left, 0.5))
            except queue_module.Empty:
                for r, p in enumerate(procs):
                    if r not in done and p.exitcode not in (None, 0):
                        raise RuntimeError(f"rank {r} of {world} died with exit code {p.exitcode} "
                                           f"in {worker.__name__} before reporting") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world} failed in {worker.__name__}:\n{payload}")
            done[rank] = payload
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)
        results.close()
    return [done[r] for r in range(world)]


# ---- models by name, without the face's registry -------------------------------------


def model_names() -> list[str]:
    """The names `load_named` accepts: the lab's model files in `data/`, and SmolLM2."""
    heads = {p.stem for p in paths.DATA_DIR.glob("*-mtp*.safetensors")}  # drafting heads, not models
    return sorted({p.stem for p in paths.DATA_DIR.glob("*.safetensors")} - heads | {SMOLLM2})


def load_named(name: str, dtype: torch.dtype = torch.float32):
    """The model (no tokenizer) that `labkit.load(name)` would return, in eval mode."""
    if name == SMOLLM2:
        from labkit.model.gguf import load_gguf

        model = load_gguf(paths.smollm2_gguf_path(), dtype=dtype)
        model.config = model.config.replace(name=SMOLLM2)
        return model.eval().requires_grad_(False)
    from labkit.model.checkpoint import load_model

    model, _ = load_model(paths.data_path(f"{name}.safetensors"), dtype=dtype)
    return model


def check_request(model_name, prompts, n_new) -> None:
    """ValueError naming the parameter for a bad model name, prompt or token count."""
    if not isinstance(model_name, str) or model_name not in model_names():
        raise ValueError(f"model_name must be one of {model_names()}, got {model_name!r}")
    for ids in prompts:
        if (not isinstance(ids, (list, tuple)) or not ids
                or not all(checks.is_int(t) and t >= 0 for t in ids)):
            raise ValueError(f"prompt_ids must be a non-empty list of token ids (ints >= 0), got {ids!r}")
    checks.positive_int("n_new", n_new)


# ---- greedy decoding, in two stages that can run on different ranks ------------------


@torch.inference_mode()
def prefill_last(model, prompt_ids: list[int], cache) -> tuple[torch.Tensor, float]:
    """Run the prompt into `cache`: (float32 logits of its last position [V], seconds)."""
    t0 = clock_now()
    logits = model(torch.tensor([prompt_ids]), cache=cache, last_only=True)[0, -1].float()  # [V]
    return logits, clock_now() - t0


@torch.inference_mode()
def decode_greedy(model, cache, first: int, n_new: int) -> tuple[list[int], list[float]]:
    """`n_new` greedy tokens starting with `first` (the prefill's pick): (ids, seconds of each step).

    Step i feeds token i and picks token i + 1, so there are n_new - 1 steps; the cache
    grows by one position each.
    """
    ids, step_s = [first], []
    for _ in range(n_new - 1):
        t0 = clock_now()
        logits = model(torch.tensor([[ids[-1]]]), cache=cache)[0, -1]  # [V]
        ids.append(int(logits.argmax()))
        step_s.append(clock_now() - t0)
    return ids, step_s
