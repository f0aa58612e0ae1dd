"""The peers a benchmark compares labkit with on the same GGUF file: Hugging Face transformers and llama.cpp.

Each runner takes (model, prompt ids, n) and returns seconds per decoded token (`*_decode`)
or the seconds of one prefill of the prompt (`*_prefill`). llama.cpp comes from the optional
`peers` extra (`pip install -e '.[peers]'`, `llama-cpp-python`, built from source in several
minutes); when it is missing the benchmark says so and measures the others.
"""
from __future__ import annotations

import time

__all__ = ["load_llama_cpp", "llama_cpp_decode", "llama_cpp_prefill", "transformers_prefill"]


def load_llama_cpp(n_ctx: int = 1024):
    """A llama.cpp model on SmolLM2's GGUF file with torch's thread count, or None when llama-cpp-python is missing."""
    import torch

    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from labkit.data import paths

    threads = torch.get_num_threads()
    return Llama(model_path=str(paths.smollm2_gguf_path()), n_ctx=n_ctx, n_threads=threads,
                 n_threads_batch=threads, n_batch=512, verbose=False)


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
