"""The pure parts of the SmolLM2 decode benchmark (the timings themselves are not asserted)."""
from labkit.benchmarks import smollm2 as bench
from labkit.model import ModelConfig


def test_bytes_per_token_counts_weights_and_kv_cache():
    cfg = ModelConfig.from_name("smollm2-135m")
    read = bench.bytes_per_token(cfg, dtype_bytes=4, context=100)
    assert read["weights"] == (134_479_872 + 61 * 576) * 4  # every matmul weight (LM head included) and the norms
    assert read["kv"] == 100 * 2 * 30 * 3 * 64 * 4
    assert read["total"] == read["weights"] + read["kv"]
    assert bench.bytes_per_token(cfg, 2, 0)["total"] * 2 == bench.bytes_per_token(cfg, 4, 0)["total"]


def test_native_bf16_says_why():
    has, why = bench.native_bf16()
    assert isinstance(has, bool) and why
    assert ("no native bfloat16" in why) != has


def test_roofline_fraction_pairs_each_round_with_its_own_sample():
    import pytest

    # 1 GB per token, 10 tokens in 1 s = 10 GB/s; rounds against 20, 10, 40 GB/s -> 0.5, 1.0, 0.25
    assert bench.roofline_fraction(1e9, 10, [1.0, 1.0, 1.0], [20.0, 10.0, 40.0]) == 0.5
    assert bench.roofline_fraction(1e9, 10, [2.0, 1.0, 0.5], [5.0, 10.0, 20.0]) == 1.0
    with pytest.raises(ValueError, match="one roofline sample per round"):
        bench.roofline_fraction(1e9, 10, [1.0, 1.0], [20.0])


def test_quant_bench_times_every_contender_each_round_with_its_prefill_untimed():
    from labkit.benchmarks import quant

    events = []

    def decoder(tag, ids, n):
        return (lambda: events.append(("setup", tag))), (lambda: events.append(("call", tag, n)))

    contenders = {"a": (decoder, None, "a", 1), "b": (decoder, None, "b", 2)}
    run = quant._decode_run(contenders, [1, 2], 4, rounds=3, between=lambda: events.append("roof"))
    assert run["a"].rounds == run["b"].rounds == 3 and run.paired and run["a"].per == "token"
    timed = events[4:]  # after one untimed warm-up each
    assert timed.count("roof") == 3 and timed.count(("call", "a", 4)) == timed.count(("call", "b", 4)) == 3
    for i, e in enumerate(timed):  # every call right after its own setup
        if isinstance(e, tuple) and e[0] == "call":
            assert timed[i - 1] == ("setup", e[1])


def test_llama_cpp_peer_decodes_the_same_file_when_installed():
    import pytest

    pytest.importorskip("llama_cpp")
    from labkit.benchmarks import peers
    from labkit.data import paths

    try:
        paths.smollm2_gguf_path()
    except FileNotFoundError:
        pytest.skip("SmolLM2 is not installed")
    llm = peers.load_llama_cpp(n_ctx=128)
    ids = llm.tokenize(b"The capital of France is", add_bos=False)
    assert peers.llama_cpp_prefill(llm, ids) > 0 and peers.llama_cpp_decode(llm, ids, 3) > 0
    assert llm.n_tokens == len(ids) + 3


def test_bench_lists_only_benchmarks_and_each_has_a_title_and_a_runner():
    from labkit.commands.bench import available

    benches = available()
    assert {"quant", "quality", "speculative", "smollm2"} <= set(benches)
    assert "machinecheck" not in benches  # a helper module, not a benchmark
    assert all(isinstance(m.TITLE, str) and callable(m.run) for m in benches.values())
