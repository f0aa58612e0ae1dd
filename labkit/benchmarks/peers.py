"""The peers a benchmark compares labkit with on the same GGUF file: Hugging Face transformers and llama.cpp.

Each runner takes (model, prompt ids, n) and returns seconds per decoded token (`*_decode`)
or the seconds of one prefill of the prompt (`*_prefill`); a comparison runs each side in its own process
(`labkit.benchmarks.workers`). llama.cpp comes from the optional
`peers` extra (`pip install -e '.[peers]'`, `llama-cpp-python`, built from source in several
minutes); when it is missing the benchmark says so and measures the others.
"""
from __future__ import annotations

__all__ = ["load_llama_cpp", "llama_cpp_decode", "llama_cpp_prefill", "transformers_prefill"]

def _gemma3_path():
    from labkit.data import paths

    return paths.gemma3_gguf_path()


def _smollm2_path():
    from labkit.data import paths

    return paths.smollm2_gguf_path()


GGUF_FILES = {"smollm2-135m": _smollm2_path, "gemma3-270m": _gemma3_path}  # model name -> its GGUF file's path


def load_llama_cpp(n_ctx: int = 1024, model: str = "smollm2-135m"):
    """A llama.cpp model on the GGUF file of `model` ("smollm2-135m" or "gemma3-270m") with torch's thread count,
    or None when llama-cpp-python is missing.

    The weights stay in llama.cpp's plain CPU buffers (`use_extra_bufts = False`): no repacking into
    AMX tiles, whose kernel crashes on machines that list AMX but do not grant a process its tiles
    (a segmentation fault in `ggml_backend_amx_mul_mat`), and which a laptop CPU does not have.
    """
    import torch

    try:
        from llama_cpp import Llama
        from llama_cpp import llama_cpp as low_level
    except ImportError:
        return None
    if model not in GGUF_FILES:
        raise ValueError(f"model must be one of {tuple(GGUF_FILES)}, got {model!r}")
    threads = torch.get_num_threads()
    default = low_level.llama_model_default_params

    def plain_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = plain_buffers
    try:
        return Llama(model_path=str(GGUF_FILES[model]()), n_ctx=n_ctx, n_threads=threads,
                     n_threads_batch=threads, n_batch=512, verbose=False)
    finally:
        low_level.llama_model_default_params = default


def llama_cpp_decode(llm, prompt_ids: list[int], n: int) -> float:
    """Greedy: evaluate the prompt, then `n` steps of argmax and one-token evaluation; seconds per step."""
    import numpy as np

    from labkit import measure

    llm.reset()
    llm.eval(prompt_ids)
    with measure.timer() as t:
        for _ in range(n):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return t.seconds / n


def llama_cpp_prefill(llm, prompt_ids: list[int]) -> float:
    """Seconds to evaluate the prompt from an empty cache (time to the first token's logits)."""
    from labkit import measure

    llm.reset()
    with measure.timer() as t:
        llm.eval(prompt_ids)
    return t.seconds


def transformers_prefill(model, prompt_ids: list[int]) -> float:
    """Seconds for transformers' forward over the prompt with a fresh cache."""
    import torch

    from labkit import measure

    with torch.inference_mode(), measure.timer() as t:
        model(torch.tensor([prompt_ids]), use_cache=True)
    return t.seconds
