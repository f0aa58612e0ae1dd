"""SmolLM2-135M decode speed at batch 1: labkit next to Hugging Face transformers, same weights and dtype.

Both models are loaded from the same GGUF file. Each measurement decodes `n_tokens`
greedy tokens after a prefilled prompt (forward one token with the KV cache, argmax),
labkit and transformers runs interleaved, median over rounds. Decode at batch 1 reads
every weight once per token, so the figures that explain the speed are printed too:
bytes read per token, the GB/s that implies, and this machine's streaming-read
bandwidth as the roofline (as gpt-fast prints "Bandwidth achieved").
"""
from __future__ import annotations

import contextlib
import functools
import statistics

from labkit.measure.clock import now as clock_now

TITLE = "SmolLM2-135M decode tokens/s: labkit vs transformers (float32, bfloat16), GB/s vs roofline"

PROMPT = "What is the capital of France? Answer in one sentence."


def native_bf16() -> tuple[bool, str]:
    """(has native bfloat16 matmul, why): AVX512-BF16 or AMX on x86 unless the kernels are capped below them
    (`labkit.costmodel.cpu.ISA_EMULATION`), or what oneDNN reports."""
    import torch

    from labkit.costmodel.cpu import emulated_isa
    from labkit.costmodel.measure import cpu_flags

    capped = emulated_isa()
    if capped:
        return False, f"the kernels are capped at {capped} (emulated): bfloat16 is converted, as on a CPU without AVX512-BF16"
    flags = cpu_flags(("avx512_bf16", "amx_bf16"))
    found = sorted(f for f, on in flags.items() if on)
    if found:
        return True, "CPU flags " + ", ".join(found)
    try:
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return True, "oneDNN reports bfloat16 support"
    except (AttributeError, RuntimeError):
        pass
    return False, "this CPU has no native bfloat16 matmul (no AVX512-BF16 or AMX flag): bfloat16 is emulated"


@contextlib.contextmanager
def _memoised_gguf():
    """transformers parses the GGUF header twice and rebuilds a name table per module; memoise both
    (pure functions of the file) so loading the reference takes seconds, not a minute."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def load_transformers(dtype):
    """The transformers Llama read from the same GGUF file, or None when transformers is missing."""
    import torch

    try:
        import accelerate  # noqa: F401  (transformers needs it to read GGUF)
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    from labkit.data import paths

    path = paths.smollm2_gguf_path()
    with _memoised_gguf():
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.to(dtype).eval()


def labkit_decode(model, prompt_ids: list[int], n_tokens: int) -> float:
    """Seconds for `n_tokens` greedy decode steps with labkit's contiguous cache (prefill not timed)."""
    import torch

    with torch.inference_mode():
        cache = model.new_cache(max_len=len(prompt_ids) + n_tokens)
        logits = model(torch.tensor([prompt_ids]), cache=cache, last_only=True)
        token = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        start = clock_now()
        for _ in range(n_tokens):
            token = model(token, cache=cache)[:, -1].argmax(-1, keepdim=True)
        return clock_now() - start


def transformers_decode(model, prompt_ids: list[int], n_tokens: int) -> float:
    """The same loop on transformers: forward one token with its default KV cache, argmax."""
    import inspect

    import torch

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # renamed in 5.x
    with torch.inference_mode():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        past, token = getattr(out, key), out.logits[:, -1].argmax(-1, keepdim=True)
        start = clock_now()
        for _ in range(n_tokens):
            out = model(token, use_cache=True, **{key: past})
            past, token = getattr(out, key), out.logits[:, -1].argmax(-1, keepdim=True)
        return clock_now() - start


def bytes_per_token(config, dtype_bytes: int, context: int) -> dict:
    """What one decode step reads: every matmul weight (LM head included) and the KV cache so far."""
    weights = (config.matmul_params() + (2 * config.n_layers + 1) * config.d_model) * dtype_bytes
    kv = int(config.kv_bytes_per_token(dtype_bytes) * context)
    return {"weights": weights, "kv": kv, "total": weights + kv}


def _other_split_decode(model, prompt_ids, n_tokens):
    """labkit with the other choice of the model's `split_matvec` (products split over threads by hand, or not)."""
    saved = model.split_matvec
    model.split_matvec = not saved
    try:
        return labkit_decode(model, prompt_ids, n_tokens)
    finally:
        model.split_matvec = saved


def _measure(contenders: dict, prompt_ids, n_tokens: int, rounds: int, roofline=None) -> tuple[dict, list]:
    """Seconds per run of each `name -> (runner, model)`, runs interleaved so machine noise hits all alike.

    `roofline()` (GB/s), when given, is sampled once per round between the runs, so the
    bandwidth the decode rate is compared with is measured under the same conditions.
    Returns (name -> list of seconds, list of roofline samples).
    """
    for runner, m in contenders.values():  # warm-up: first-call allocations, thread pools
        runner(m, prompt_ids, 4)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    roof: list[float] = []
    for _ in range(rounds):
        if roofline is not None:
            roof.append(roofline())
        for name, (runner, m) in contenders.items():
            times[name].append(runner(m, prompt_ids, n_tokens))
    return times, roof


def roofline_fraction(bytes_per_token: float, n_tokens: int, seconds: list[float], roof_gb_s: list[float]) -> float:
    """Median over rounds of (GB/s achieved in the round) / (roofline GB/s sampled in the same round)."""
    if len(seconds) != len(roof_gb_s) or not seconds:
        raise ValueError(f"need one roofline sample per round, got {len(roof_gb_s)} for {len(seconds)} rounds")
    return statistics.median(bytes_per_token * n_tokens / t / 1e9 / r for t, r in zip(seconds, roof_gb_s))


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.costmodel import measure as hwmeasure

    n_tokens, rounds = (32, 3) if quick else (64, 9)
    sample_s = 0.2 if quick else 0.4

    def roofline() -> float:
        return hwmeasure.read_bandwidth_gb_s(seconds=sample_s)

    print(f"  torch {torch.__version__}, {torch.get_num_threads()} threads; the streaming-read roofline "
          f"(a sum over 256 MB) is sampled in every round, next to the decode runs")
    from labkit import measure

    state = measure.machine_state(cpu=False)
    load = (state["loadavg"] or [0.0])[0]
    if state["busy"]:
        print(f"  note: the machine is busy (load average {load:.1f} on {state['cores']} CPUs): interleaved rounds "
              "hit both implementations alike, but absolute figures are low and noisy")
    model, tok = labkit.load("smollm2-135m")
    prompt_ids = tok.encode_chat([{"role": "user", "content": PROMPT}])
    reference = load_transformers(torch.float32)
    if reference is None:
        print("  transformers (+ accelerate) is not installed: measuring labkit only")
    has_bf16, why = native_bf16()
    splits = model.split_matvec
    report = {"threads": torch.get_num_threads(), "load_average": load, "n_tokens": n_tokens,
              "rounds": rounds, "prompt_tokens": len(prompt_ids), "native_bf16": has_bf16, "dtypes": {}}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        if dtype == torch.bfloat16 and not has_bf16:
            print(f"  bfloat16: {why}; labkit keeps bf16 weights row-major, the layout that stays fast here")
        mine = model if dtype == torch.float32 else labkit.load("smollm2-135m", dtype=dtype)[0]
        contenders = {"labkit": (labkit_decode, mine)}
        if reference is not None:
            contenders["transformers"] = (transformers_decode, reference.to(dtype))
        if torch.get_num_threads() > 1 and dtype == torch.float32:
            contenders["labkit-other"] = (_other_split_decode, model)
        times, roof = _measure(contenders, prompt_ids, n_tokens, rounds, roofline)
        rates = {k: n_tokens / statistics.median(ts) for k, ts in times.items()}
        read = bytes_per_token(model.config, torch.finfo(dtype).bits // 8, len(prompt_ids) + n_tokens // 2)
        roof_median = statistics.median(roof)
        gb_s = read["total"] * rates["labkit"] / 1e9
        fraction = roofline_fraction(read["total"], n_tokens, times["labkit"], roof)
        row = {"tok_s": rates, "bytes_per_token": read, "gb_s": gb_s, "roofline_gb_s": roof_median,
               "roofline_samples_gb_s": roof, "roofline_fraction": fraction}
        line = f"  {name:9s} labkit {rates['labkit']:6.1f} tok/s"
        if "transformers" in rates:
            paired = measure.Run.from_samples(times, paired=True)  # the contenders took turns in every round
            vs = measure.compare(paired["labkit"], paired["transformers"])
            row["speedup"], row["vs_transformers"] = vs.speedup, vs.as_dict()
            line += f" | transformers {rates['transformers']:6.1f} tok/s | {vs}"
        print(line)
        if "labkit-other" in rates:
            other = roofline_fraction(read["total"], n_tokens, times["labkit-other"], roof)
            row["other_split_roofline_fraction"] = other
            how = ("plain torch.mm products (split_matvec = False)" if splits else
                   f"products split over {torch.get_num_threads()} threads by hand (split_matvec = True)")
            print(f"            labkit with {how}: {rates['labkit-other']:.1f} tok/s, "
                  f"{100 * other:.0f} % of the roofline")
        print(f"            {read['total'] / 1e6:.0f} MB read per token ({read['weights'] / 1e6:.0f} MB weights, "
              f"{read['kv'] / 1e6:.1f} MB KV) -> {gb_s:.1f} GB/s")
        print(f"            roofline {roof_median:.1f} GB/s (median of {len(roof)} samples, "
              f"{min(roof):.1f}-{max(roof):.1f}); per round, labkit reached a median {100 * fraction:.0f} % of it")
        report["dtypes"][name] = row
    if reference is not None:
        reference.to(torch.float32)
    return report
