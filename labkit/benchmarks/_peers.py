"""The peers a benchmark compares labkit with on the same GGUF file: Hugging Face transformers and llama.cpp.

Each runner takes (model, prompt ids, n) and returns seconds per decoded token (`*_decode`)
or the seconds of one prefill of the prompt (`*_prefill`). llama.cpp comes from the optional
`peers` extra (`pip install -e '.[peers]'`, `llama-cpp-python`, built from source in several
minutes); when it is missing the benchmark says so and measures the others.
"""
from __future__ import annotations

import time

__all__ = ["load_llama_cpp", "llama_cpp_decode", "llama_cpp_prefill", "transformers_prefill", "llama_cpp_decode_isolated"]

_CHILD = """
import json, sys
from labkit.benchmarks._peers import llama_cpp_decode, load_llama_cpp
ids, n, threads = json.loads(sys.argv[1])
import torch
torch.set_num_threads(threads)
llm = load_llama_cpp()
print(json.dumps(None if llm is None else llama_cpp_decode(llm, ids, n)))
"""


def load_llama_cpp(n_ctx: int = 1024):
    """A llama.cpp model on SmolLM2's GGUF file with torch's thread count, or None when llama-cpp-python is missing.

    The weights stay in llama.cpp's plain CPU buffers (`use_extra_bufts = False`): no repacking into
    AMX tiles, whose kernel crashes on machines that list AMX but do not grant a process its tiles
    (measured: a segmentation fault in `ggml_backend_amx_mul_mat`), and which a laptop CPU does not have.
    """
    import torch

    try:
        from llama_cpp import Llama
        from llama_cpp import llama_cpp as low_level
    except ImportError:
        return None
    from labkit.data import paths

    threads = torch.get_num_threads()
    default = low_level.llama_model_default_params

    def plain_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = plain_buffers
    try:
        return Llama(model_path=str(paths.smollm2_gguf_path()), n_ctx=n_ctx, n_threads=threads,
                     n_threads_batch=threads, n_batch=512, verbose=False)
    finally:
        low_level.llama_model_default_params = default


def llama_cpp_decode(llm, prompt_ids: list[int], n: int) -> float:
    """Greedy: evaluate the prompt, then `n` steps of argmax and one-token evaluation; seconds per step."""
    import numpy as np

    llm.reset()
    llm.eval(prompt_ids)
    start = time.perf_counter()
    for _ in range(n):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return (time.perf_counter() - start) / n


def llama_cpp_prefill(llm, prompt_ids: list[int]) -> float:
    """Seconds to evaluate the prompt from an empty cache (time to the first token's logits)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt_ids)
    return time.perf_counter() - start


def transformers_prefill(model, prompt_ids: list[int]) -> float:
    """Seconds for transformers' forward over the prompt with a fresh cache."""
    import torch

    with torch.inference_mode():
        start = time.perf_counter()
        model(torch.tensor([prompt_ids]), use_cache=True)
        return time.perf_counter() - start


def llama_cpp_decode_isolated(prompt_ids: list[int], n: int, timeout_s: float = 300.0) -> tuple[float | None, str | None]:
    """`llama_cpp_decode` in a child process: (seconds per step, None), or (None, why) when llama.cpp is missing or
    fails. A crash inside the native library (a build for instructions this machine does not run) ends the child,
    not the benchmark."""
    import json
    import subprocess
    import sys

    import torch

    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([list(prompt_ids), n, torch.get_num_threads()])],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"llama.cpp did not finish in {timeout_s:.0f} s"
    if proc.returncode != 0:
        signal = {-11: " (segmentation fault)", -4: " (illegal instruction)"}.get(proc.returncode, "")
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return None, f"llama.cpp exited with code {proc.returncode}{signal} {tail[0][:200]}".rstrip()
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    return (None, "llama-cpp-python is not installed (pip install -e '.[peers]')") if seconds is None else (seconds, None)


def rates_beside_llama_cpp(models: dict, ids: list[int], n: int, rounds: int, each_round=None) -> tuple[dict, str | None]:
    """Decode tokens/s of each name -> model and of llama.cpp on the same GGUF file, in interleaved rounds
    (`each_round()` is called at the start of each, e.g. a roofline sample): (rates, why llama.cpp is missing)."""
    import statistics

    from labkit.generation.profile import decode_rates

    seconds, peer, why = {name: [] for name in models}, [], None
    for _ in range(rounds):
        if each_round is not None:
            each_round()
        for name, rate in decode_rates(models, ids, n=n, rounds=1).items():
            seconds[name].append(1 / rate)
        if why is None:
            step_s, why = llama_cpp_decode_isolated(ids, n)
            if step_s is not None:
                peer.append(step_s)
    rates = {name: 1 / statistics.median(s) for name, s in seconds.items()}
    if peer:
        rates["llama.cpp Q4_1"] = 1 / statistics.median(peer)
    return rates, why
