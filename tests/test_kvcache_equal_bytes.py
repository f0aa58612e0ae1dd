"""Equal bytes across cache kinds, long-context perplexity through them, the passkey task."""
from __future__ import annotations

import math

import pytest
import torch

from labkit.kvcache.longcontext import feed, long_perplexity, stream_nll
from labkit.kvcache.memory import kv_bytes_per_token
from labkit.kvcache.sizing import BOUND_OPTION, equal_bytes_options, full_bytes, held_bytes
from labkit.metrics.likelihood import perplexity
from tests.kvcache_shared import ids, tiny

QUANT = dict(group_size=8, residual=16)  # the tiny model's head_dim is 8


def _fill(model, kind, options, length, appended=0, chunk=24):
    """A new cache filled to `length` tokens: SnapKV's prompt of length - appended in one pass, then chunks."""
    cache = model.new_cache(kind, **{"max_len": length, **options})
    x = ids(length, seed=5)[0].tolist()
    prompt = length - appended
    feed(model, x[:prompt], cache, chunk)
    if appended:
        feed(model, x[prompt:], cache, chunk)
    assert cache.seq_len == length
    return cache


@pytest.mark.parametrize("length", [200, 203])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_equal_bytes_options_hold_the_target_in_real_caches(length, fraction):
    model = tiny()
    one_token = kv_bytes_per_token(model.config, bits=32)
    for appended in (0, 12):
        rows = equal_bytes_options(model.config, length, fraction, appended=appended, **QUANT)
        assert [r["name"] for r in rows] == ["sliding", "h2o", "snapkv", "int8", "int4"]
        for row in rows:
            cache = _fill(model, row["kind"], row["options"], length, appended if row["kind"] == "snapkv" else 0)
            real = cache.bytes_allocated()
            assert real == pytest.approx(row["bytes"]), row["name"]  # the formula is what bytes_allocated counts
            assert real == pytest.approx(held_bytes(model.config, row["kind"], {"max_len": length, **row["options"]},
                                                    length, appended=appended if row["kind"] == "snapkv" else 0))
            if row["settable"]:  # within one held token (keys, values and the kind's bookkeeping) below the target
                one = held_bytes(model.config, row["kind"], {BOUND_OPTION[row["kind"]]: 1}, length)
                assert one >= one_token
                assert row["target_bytes"] - one < real <= row["target_bytes"], row["name"]
            assert row["fraction"] == pytest.approx(real / full_bytes(model.config, length))


def test_quantized_reports_its_own_share_and_the_reference_is_the_contiguous_cache():
    model = tiny()
    full = model.new_cache("contiguous", max_len=256)
    assert full.bytes_allocated() == full_bytes(model.config, 256)
    int8, int4 = [r for r in equal_bytes_options(model.config, 256, 0.1, **QUANT) if r["kind"] == "quantized"]
    assert not int8["settable"] and not int4["settable"]
    # codes + a float16 scale and minimum per 8 values, plus 16 full-precision tokens, over 4 bytes a value
    assert int8["fraction"] == pytest.approx((8 + 4) / 32 + 16 / 256)
    assert int4["fraction"] == pytest.approx((4 + 4) / 32 + 16 / 256)
    assert int8["options"] == equal_bytes_options(model.config, 256, 0.5, **QUANT)[3]["options"]


@pytest.mark.parametrize("bad, word", [(dict(fraction=0), "fraction"), (dict(fraction=1.5), "fraction"),
                                       (dict(length=0), "length"), (dict(appended=300), "appended"),
                                       (dict(fraction=0.01), "fraction")])
def test_equal_bytes_refuses_bad_input(bad, word):
    args = {"length": 256, "fraction": 0.25, **bad}
    with pytest.raises(ValueError, match=word):
        equal_bytes_options(tiny().config, args.pop("length"), args.pop("fraction"), **args, **QUANT)
    with pytest.raises(ValueError, match="kind"):
        held_bytes(tiny().config, "paged", {}, 16)


def test_stream_nll_scores_every_token_once_as_the_model_without_cache():
    model, x = tiny(), ids(150, seed=2)[0].tolist()
    nll = stream_nll(model, x, model.new_cache("contiguous", max_len=150), chunk=32)
    assert nll.shape == (149,)
    assert math.exp(float(nll.mean())) == pytest.approx(perplexity(model, x), rel=1e-5)


def test_unbounded_eviction_budget_gives_the_contiguous_perplexity():
    model, x = tiny(), ids(160, seed=3)[0].tolist()
    full = long_perplexity(model, x, "contiguous", chunk=32, tail=40)
    for kind, bound in BOUND_OPTION.items():
        if kind == "sliding":
            continue
        got = long_perplexity(model, x, kind, {bound: 1000}, chunk=32, tail=40)
        assert got["ppl"] == pytest.approx(full["ppl"], rel=1e-5), kind
        assert got["ppl_tail"] == pytest.approx(full["ppl_tail"], rel=1e-5), kind
        assert got["held"] == 160
    small = long_perplexity(model, x, "h2o", {"budget": 16}, chunk=32, tail=40)  # a real budget changes the scores
    assert small["held"] == 16 and abs(small["ppl_tail"] - full["ppl_tail"]) > 1e-3 * full["ppl_tail"]
    with pytest.raises(ValueError, match="tail"):
        long_perplexity(model, x, "h2o", {"budget": 16}, tail=160)


# ---- the passkey task (SmolLM2's tokenizer: fast to load; skipped without the GGUF package) --------------


@pytest.fixture(scope="module")
def tok():
    from labkit.data import paths
    from labkit.tokenizer import get_tokenizer

    try:
        paths.smollm2_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return get_tokenizer("smollm2")


@pytest.mark.parametrize("filler", ["repeat", "shakespeare"])
@pytest.mark.parametrize("length", [1024, 2048, 8192])
def test_passkey_prompt_is_seeded_sized_and_holds_the_key_where_it_says(tok, length, filler):
    from labkit.generation.passkey import passkey_prompt

    task = passkey_prompt(tok, length, seed=7, filler=filler)
    assert task == passkey_prompt(tok, length, seed=7, filler=filler)  # deterministic
    other = passkey_prompt(tok, length, seed=8, filler=filler)
    assert (other["key"], other["depth"]) != (task["key"], task["depth"])
    assert abs(task["length"] - length) <= 3 and task["length"] == len(task["ids"])
    assert len(task["key"]) == 5 and task["key"].isdigit()
    i = task["key_index"]
    assert tok.decode(task["ids"][i:i + 5]) == task["key"]
    assert len(task["key_indices"]) == 2 and task["key_indices"][0] == i  # the needle says the key twice
    j = task["key_indices"][1]
    assert tok.decode(task["ids"][j:j + 5]) == task["key"] and 5 < j - i < 20
    assert "pass key is" in tok.decode(task["ids"][i - 6:i])
    assert abs(i / length - task["depth"]) < 0.06  # the needle sits at its depth of the filler
    assert tok.decode(task["ids"]).count(task["key"]) == 2  # the needle says it twice, nothing else does
    assert tok.decode(task["ids"][-30:]).count("What is the pass key?") == 1


def test_passkey_prompt_refuses_bad_input(tok):
    from labkit.generation.passkey import passkey_prompt

    for bad, word in [(dict(length=10), "length"), (dict(digits=0), "digits"), (dict(filler="lorem"), "filler")]:
        with pytest.raises(ValueError, match=word):
            passkey_prompt(tok, **{"length": 1024, **bad})


def test_score_answer_accepts_the_key_and_rejects_others():
    from labkit.generation.passkey import score_answer

    assert score_answer("The pass key is 41190.", "41190")
    assert score_answer("41190", "41190")
    for wrong in ("4119", "411900", "41191", "no idea", "", "The pass key is 4 1190"):
        assert not score_answer(wrong, "41190"), wrong


@torch.inference_mode()
def test_compare_at_budget_runs_every_kind_on_a_tiny_model_with_smollm2s_vocabulary(tok):
    from labkit.generation.compression import compare_at_budget

    model = tiny(vocab_size=tok.vocab_size, d_model=96, n_heads=3, n_kv_heads=1, max_seq_len=512)
    text = tok.encode("To be, or not to be, that is the question. " * 60)[:400]
    out = compare_at_budget(model, tok, text, 0.25, trials=1, tail=64, chunk=64, itl_positions=[100, 400], itl_steps=1)
    names = [r["name"] for r in out["rows"]]
    assert names == ["full", "sliding", "h2o", "snapkv", "int8", "int4"]
    for row in out["rows"]:
        target = 1.0 if row["name"] == "full" else 0.25
        if row["settable"]:
            assert target - 0.02 < row["fraction"] <= target + 1e-9, row["name"]
        assert row["ppl"] > 1 and 0 <= row["passkey"] <= 1 and row["itl_s"] > 0
    assert {(r["name"], r["position"]) for r in out["itl"]} == {(n, p) for n in names for p in (100, 400)}
    for r in out["itl"]:  # every step's time kept, its median the row's ITL
        assert len(r["samples"]) == 1 and r["itl_s"] == r["samples"][0] > 0
    for row in out["rows"]:
        assert row["feeding"] == ("one pass" if row["name"] == "snapkv" else "chunks of 64")
        assert len(row["key_kept"]) == 1 and 0 <= row["key_kept"][0] <= 1
        assert row["peak_tokens"] == (400 if row["name"] in ("full", "snapkv", "int8", "int4") else row["peak_tokens"])
    swapped = compare_at_budget(model, tok, text, 0.25, trials=1, tail=64, chunk=64, protocols=True, itl_by=False)
    rows = {r["name"]: r for r in swapped["rows"]}
    assert rows["snapkv, chunks"]["feeding"] == "chunks of 64" and rows["h2o, one pass"]["feeding"] == "one pass"
    assert rows["h2o, one pass"]["peak_tokens"] == 400 and rows["snapkv, chunks"]["peak_tokens"] < 400
    assert rows["snapkv, chunks"]["options"]["every_pass"] is True and swapped["itl"] == []
    assert all(r["itl_s"] is None for r in swapped["rows"])


@torch.inference_mode()
def test_passkey_and_itl_refuse_what_the_context_window_cannot_hold(tok):
    from labkit.generation.compression import budget_specs, itl_by_position
    from labkit.generation.passkey import passkey_prompt, passkey_trial

    model = tiny(vocab_size=tok.vocab_size, d_model=96, n_heads=3, n_kv_heads=1, max_seq_len=512)
    task = passkey_prompt(tok, 500)
    with pytest.raises(ValueError, match="no room for max_new_tokens=16"):
        passkey_trial(model, tok, task)
    assert passkey_trial(model, tok, task, max_new_tokens=512 - len(task["ids"]) + 1)["bytes"] > 0  # exactly fits
    with pytest.raises(ValueError, match="the largest may be 506"):
        itl_by_position(model, budget_specs(model, 500, 0.25), [100, 507], steps=5)


def test_docstring_examples():
    import doctest

    import labkit.kvcache.sizing as sizing

    result = doctest.testmod(sizing)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow
def test_smollm2_retrieves_the_passkey_with_the_full_cache_at_1k():
    """The task is within the real model's reach (what compressed kinds are measured against), and a window
    that holds only the question cannot answer it (the scorer does not pass a guess)."""
    from labkit.generation.passkey import passkey_accuracy, passkey_prompt, passkey_trial
    from tests.smollm2_shared import smollm2

    model, tok = smollm2()
    assert passkey_accuracy(model, tok, 1024, trials=3)["accuracy"] == 1.0
    task = passkey_prompt(tok, 1024, seed=0)
    assert not passkey_trial(model, tok, task, "sliding", {"window": 36, "sinks": 4}, chunk=16)["correct"]


def test_feed_traces_the_peak_and_the_feeding_can_be_swapped():
    model = tiny()
    x = ids(200, seed=5)[0].tolist()
    for kind, options, one_pass, peak, passes in [
            ("h2o", {"budget": 40}, None, 40 + 24, 9), ("h2o", {"budget": 40}, True, 200, 1),
            ("snapkv", {"prompt_budget": 40, "obs_window": 8}, None, 200, 1),
            ("snapkv", {"prompt_budget": 40, "obs_window": 8, "every_pass": True}, None, 40 + 24, 9),
            ("contiguous", {}, None, 200, 9), ("contiguous", {}, True, 200, 1)]:
        cache = model.new_cache(kind, max_len=210, **options)
        trace = {}
        feed(model, x, cache, 24, one_pass, trace)
        assert trace["peak_tokens"] == peak, (kind, options, one_pass)
        assert sum(trace["passes"]) == 200 and len(trace["passes"]) == passes
        held = getattr(cache, "n_cached", cache.seq_len)
        assert held == (200 if kind == "contiguous" else 40)  # SnapKV voting every chunk stays at its budget too


def test_snapkv_every_pass_keeps_the_window_and_the_voted_tokens_of_the_whole_text():
    model = tiny()
    cache = model.new_cache("snapkv", max_len=210, prompt_budget=40, obs_window=8, every_pass=True)
    feed(model, ids(200, seed=5)[0].tolist(), cache, 24)
    kept = cache.kept_positions(0)
    assert kept.shape[-1] == 40 and (kept[..., -8:] == torch.arange(192, 200)).all()  # the last chunk's window
    with pytest.raises(ValueError, match="every_pass"):
        model.new_cache("snapkv", max_len=10, prompt_budget=8, obs_window=2, every_pass="yes")


def test_key_kept_reads_what_each_head_holds(tok):
    from labkit.generation.passkey import key_kept, passkey_prompt

    task = passkey_prompt(tok, 1024, seed=1)
    model = tiny(vocab_size=tok.vocab_size, max_seq_len=1100)
    full = model.new_cache("contiguous", max_len=1100)
    assert key_kept(full, task) == 1.0
    i = task["key_index"]
    # a window that ends before the key never holds it; one over the whole prompt always does
    short = model.new_cache("sliding", max_len=1100, window=64, sinks=4)
    feed(model, task["ids"][:i + 5 + 100], short, 50)
    assert key_kept(short, task) == 0.0
    # a window that ends just after the second copy holds that copy only: the key is still there
    second = model.new_cache("sliding", max_len=1100, window=16, sinks=4)
    j = task["key_indices"][1]
    feed(model, task["ids"][:j + 5], second, 4)
    assert key_kept(second, task) == 1.0 and key_kept(second, task, per_digit=True) == [1.0] * 5
    wide = model.new_cache("sliding", max_len=1100, window=1100, sinks=4)
    feed(model, task["ids"], wide, 256)
    assert key_kept(wide, task) == 1.0
    h2o = model.new_cache("h2o", max_len=1100, budget=64)
    feed(model, task["ids"], h2o, 256)
    share = key_kept(h2o, task)
    by_hand = [any(all(d in set(h2o.kept_positions(layer)[0, h].tolist()) for d in range(s, s + 5))
                   for s in task["key_indices"])
               for layer in range(model.config.n_layers) for h in range(model.config.n_kv_heads)]
    assert share == pytest.approx(sum(by_hand) / len(by_hand))


def test_held_bytes_names_the_option_a_kind_is_sized_by():
    model = tiny()
    with pytest.raises(ValueError, match=r"options of a snapkv cache must give prompt_budget=.*got \{'budget': 8\}"):
        held_bytes(model.config, "snapkv", {"budget": 8}, 100)
    one, two = (held_bytes(model.config, "snapkv", {"prompt_budget": b}, 100) for b in (8, 16))
    assert two == 2 * one > 0  # the prompt's part holds prompt_budget tokens when the prompt is longer
