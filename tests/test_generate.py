"""Generation on SmolLM2: the one-sentence reply, prefill/decode, streaming, stops, timings, the CLI."""
import io
import types

import pytest
import torch

import labkit
from labkit.commands import chat as chat_cmd
from labkit.commands.generate import timing_table
from tests.smollm2_shared import smollm2

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def smol():
    return smollm2()


@pytest.fixture(scope="module")
def reply(smol):
    model, tok = smol
    return labkit.generate(model, tok, QUESTION)


def test_the_one_sentence_reply(reply, smol):
    _, tok = smol
    assert reply.text == "The capital of France is Paris."
    assert reply.finish_reason == "eos" and reply.token_ids[-1] == tok.eos_id
    assert tok.decode(reply.prompt_ids).startswith("<|im_start|>system\n")
    assert len(reply.itl_s) == len(reply.token_ids) - 1


def test_timings_are_consistent(reply):
    stages = reply.stages
    assert [s for s, _, _ in stages[:2]] == ["tokenize", "prefill"] and stages[-1][0] == "detokenize"
    assert [s for s, _, _ in stages[2:-1]] == [f"decode {i}" for i in range(1, len(reply.token_ids))]
    assert all(a <= b for _, a, b in stages) and all(b1 <= a2 for (_, _, b1), (_, a2, _) in zip(stages, stages[1:]))
    assert reply.ttft_s == pytest.approx(reply.tokenize_s + reply.prefill_s)
    assert reply.decode_s == pytest.approx(sum(reply.itl_s), rel=0.05)
    rows = reply.timings()
    assert rows[1]["stage"] == "prefill" and rows[1]["duration_s"] == pytest.approx(reply.prefill_s)
    fig = labkit.viz.reply_timeline(reply)
    assert {t.name for t in fig.data} == {"tokenize", "prefill", "decode", "detokenize"}
    decode_bars = next(t for t in fig.data if t.name == "decode")
    assert len(decode_bars.x) == len(reply.itl_s)
    assert decode_bars.base[0] == pytest.approx(rows[2]["start_s"] * 1e3)
    table = timing_table(reply)
    assert "prefill" in table and "decode 1" in table and "TTFT" in table and "42 prompt tokens" in table


def test_reply_timeline_rejects_bad_rows():
    with pytest.raises(ValueError, match="unknown stage 'warmup'"):
        labkit.viz.reply_timeline([("warmup", 0.0, 1.0)])
    with pytest.raises(ValueError, match="ends before it starts"):
        labkit.viz.reply_timeline([("prefill", 1.0, 0.5)])


def test_prefill_then_decode_in_pieces_equals_one_decode(smol):
    model, tok = smol
    ids = tok.encode("Once upon a time")
    state = labkit.prefill(model, ids)
    assert state.position == len(ids) and state.logits.shape == (49152,)
    first = labkit.decode(model, state, 4)
    second = labkit.decode(model, state, 4)
    assert state.position == len(ids) + 8
    assert first + second == labkit.decode(model, labkit.prefill(model, ids), 8)


def test_decode_without_prefill_fails_clearly(smol):
    model, _ = smol
    with pytest.raises(TypeError, match="decode needs the PrefillState returned by labkit.prefill"):
        labkit.decode(model, None, 4)
    with pytest.raises(TypeError, match="KV cache that prefill builds"):
        labkit.decode(model, model.new_cache(max_len=8), 4)


def test_stream_pieces_join_to_the_generated_text_and_stops_cut(smol):
    model, tok = smol
    prompt = "Write a haiku about the sea."
    full = labkit.generate(model, tok, prompt, max_new_tokens=14)
    pieces = list(labkit.stream(model, tok, prompt, max_new_tokens=14))
    assert len(pieces) > 5 and "".join(pieces) == full.text
    assert full.finish_reason == "length" and len(full.token_ids) == 14 and "\n" in full.text
    cut = labkit.generate(model, tok, prompt, max_new_tokens=14, stop=["\n"])
    assert cut.finish_reason == "stop" and "\n" not in cut.text and full.text.startswith(cut.text)
    assert "".join(labkit.stream(model, tok, prompt, max_new_tokens=14, stop=["\n"])) == cut.text


def test_sampling_is_seeded(smol):
    model, tok = smol
    kw = dict(max_new_tokens=6, temperature=1.0, top_p=0.95)
    a = labkit.generate(model, tok, "Tell me a story.", seed=3, **kw)
    b = labkit.generate(model, tok, "Tell me a story.", seed=3, **kw)
    c = labkit.generate(model, tok, "Tell me a story.", seed=4, **kw)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    with pytest.raises(ValueError, match="top_p must be in"):
        labkit.generate(model, tok, "Hi", top_p=1.5)


def test_prompt_longer_than_the_context(smol):
    model, tok = smol
    long_tok = types.SimpleNamespace(encode=lambda text: [1] * 8200, eos_id=2, chat_template=None)
    with pytest.raises(ValueError, match="the prompt has 8200 tokens; the context window is 8192 tokens"):
        labkit.generate(model, long_tok, "x")


def test_cli_generate_prints_the_reply_and_the_table(capsys, smol, monkeypatch):
    monkeypatch.setattr(labkit, "load", lambda name, dtype=torch.float32: smol)
    from labkit.cli import main

    assert main(["generate", "--model", "smollm2-135m", QUESTION]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The capital of France is Paris.\n")
    for stage in ("tokenize", "prefill", "decode 1", "detokenize", "TTFT"):
        assert stage in out


def test_cli_chat_keeps_the_conversation(smol, monkeypatch):
    monkeypatch.setattr(labkit, "load", lambda name, dtype=torch.float32: smol)
    args = chat_cmd.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args(
        ["--max-new-tokens", "12"])
    stdout = io.StringIO()
    assert chat_cmd.run(args, stdin=io.StringIO(f"{QUESTION}\n/reset\n/quit\n"), stdout=stdout) == 0
    text = stdout.getvalue()
    assert "The capital of France is Paris." in text and "(conversation forgotten)" in text


def test_labkit_generate_is_the_function_even_after_importing_every_submodule(reply, smol):
    import labkit.generation.reply  # noqa: F401  (the module that defines it is named differently)
    from labkit import generation

    assert labkit.generate is generation.generate and callable(labkit.generate)
    model, tok = smol
    assert labkit.generate(model, tok, QUESTION, max_new_tokens=2).token_ids == reply.token_ids[:2]
