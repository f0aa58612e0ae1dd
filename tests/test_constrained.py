"""Constrained decoding: regex -> byte DFA (checked against Python's `re`), the vocabulary index (against
outlines-core's masks), JSON Schema -> regex (every sampled reply validates with `jsonschema`), in
`labkit.generate`, in the serving engine and behind `response_format`, and clear errors for what is not supported."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
import torch

import labkit
from labkit.sampling.constrained import Constraint, make_constraint, token_automaton
from labkit.sampling.json_schema import JSON_OBJECT, schema_to_regex
from labkit.sampling.regex_dfa import compile_regex
from labkit.serving.engine.loop import Engine
from labkit.serving.engine.request import Request
from labkit.sampling.pipeline import SamplingParams

PATTERNS = [r"(yes|no)!", r"[0-9]{2,4}", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", r'"([^"\\]|\\.)*"', r"a*b+c?",
            r"\d{3}-\d{4}", r"(ab|a)(bc|c)", r"[a-c]{0,3}x", r"\w+@\w+\.com", r"é+(ça)?", r".{2}", r"[^a-z]{1,2}"]


@pytest.fixture(scope="module")
def shakespeare():
    return labkit.load("shakespeare")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_dfa_matches_exactly_what_python_re_fullmatches(pattern):
    dfa = compile_regex(pattern)
    rng = random.Random(0)
    alphabet = list("abcxyz0123456789-.\"\\!@éç \n") + ["yes", "no", "com", "ab", "bc"]
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        assert dfa.fullmatch(s.encode()) == bool(re.fullmatch(pattern, s)), s


@pytest.mark.parametrize("pattern, fragment", [
    ("a(?=b)", "lookarounds"), ("^a", "anchors"), ("a{2,1}", "bad repetition"), ("(a", "without ')'"),
    ("[é]", "non-ASCII"), (r"\bx", r"\b"), ("a*?", "lazy"), ("a{", "without"),
])
def test_unsupported_regex_features_raise_naming_them(pattern, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        compile_regex(pattern)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
     "required": ["name", "ok"]},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}}, "required": ["b"]},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"enum": ["red", "green", "blue"]},
    {"const": {"v": 1}},
    {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
    {"type": "object", "properties": {"owner": {"type": "object", "properties": {
        "id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                             "maxItems": 2}}, "required": ["id", "tags"]}}, "required": ["owner"]},
    {"type": "number"},
    {"type": ["integer", "null"]},
    {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"type": "null"},
                                      "z": {"type": "string", "maxLength": 3}}},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_fifty_sampled_replies_per_schema_all_validate(shakespeare, schema):
    """50 seeded samples at temperature 1 (through the batched engine), every one parses and validates."""
    model, tok = shakespeare
    engine = Engine(model, max_batch=16, num_blocks=256, token_budget=256)
    prompt = tok.encode("ROMEO:")
    # every schema here has a bounded language of at most ~70 characters: 96 tokens always reach its end
    reqs = [Request(i, prompt, 96, params=SamplingParams(temperature=1.0), seed=i, stop_ids=frozenset([tok.eos_id]),
                    constraint=make_constraint(tok, json_schema=schema)) for i in range(50)]
    engine.replay(reqs)
    for req in reqs:
        text = tok.decode([t for t in req.output if t != tok.eos_id])
        assert req.finish_reason == "stop", (text, req.finish_reason)
        jsonschema.validate(json.loads(text), schema)


def test_generate_honours_regex_choices_and_schemas_greedy_and_sampled(shakespeare):
    model, tok = shakespeare
    assert re.fullmatch(r"\d{3}-\d{4}", labkit.generate(model, tok, "ROMEO:", regex=r"\d{3}-\d{4}").text)
    picks = {labkit.generate(model, tok, "ROMEO:", choices=["love", "hate", "death"], temperature=1.0, seed=s).text
             for s in range(8)}
    assert picks <= {"love", "hate", "death"} and len(picks) > 1
    for seed in range(3):
        out = labkit.generate(model, tok, "ROMEO:", json_schema=SCHEMAS[0], temperature=0.8, top_k=20, top_p=0.9,
                              min_p=0.05, seed=seed, max_new_tokens=48)
        jsonschema.validate(json.loads(out.text), SCHEMAS[0])
    again = labkit.generate(model, tok, "ROMEO:", json_schema=SCHEMAS[0], temperature=0.8, top_k=20, top_p=0.9,
                            min_p=0.05, seed=2, max_new_tokens=48)
    assert again.text == out.text  # seeded: the same reply
    text = "".join(labkit.stream(model, tok, "ROMEO:", json_schema="json_object", max_new_tokens=30))
    assert text.startswith("{") and compile_regex(JSON_OBJECT).walk(text.encode()) >= 0  # a prefix of an object


def test_the_mask_renormalises_the_models_own_probabilities(shakespeare):
    """Constraining keeps the model's relative preferences among the legal tokens: it masks, it does not rewrite."""
    model, tok = shakespeare
    c = Constraint.regex(tok, "(love|hate|death)")
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("ROMEO:")]))[0, -1].float()
    masked = torch.softmax(c.apply(logits), -1)
    legal = c.automaton.mask(0)
    assert masked[~legal].sum() == 0
    want = torch.softmax(logits, -1)[legal]
    assert torch.allclose(masked[legal], want / want.sum(), atol=1e-6)


def test_masks_agree_with_outlines_core_or_the_regex_module_says_who_is_right(shakespeare):
    """The production peer: outlines-core's Index over the same vocabulary, followed token by token. Where the two
    masks differ, the `regex` module's partial matching (is this text a prefix of some match?) is the referee, and
    labkit must be the one it agrees with. (outlines-core 0.2.14 refuses '.' after '9' for `9(\\.[0-9]+)?`,
    though "9.5" matches.)"""
    import regex

    outlines_core = pytest.importorskip("outlines_core")
    model, tok = shakespeare
    vocab = {}
    for i in range(tok.vocab_size):
        if not tok.is_special(i):
            vocab.setdefault(tok.token_bytes(i), []).append(i)
    peer_vocab = outlines_core.Vocabulary(tok.eos_id, vocab)
    states, disagreements = 0, 0
    for pattern in [r"(yes|no)!", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", schema_to_regex(SCHEMAS[0]),
                    schema_to_regex(SCHEMAS[6])]:
        index = outlines_core.Index(pattern, peer_vocab)
        for seed in range(3):
            c, peer, text = Constraint.regex(tok, pattern), index.get_initial_state(), b""
            gen = torch.Generator().manual_seed(seed)
            for _ in range(40):
                ours = set(torch.nonzero(c.automaton.mask(c.state)).flatten().tolist())
                theirs = set(index.get_allowed_tokens(peer))
                states += 1
                for t in ours ^ theirs:
                    disagreements += 1
                    if t == tok.eos_id:
                        possible = regex.fullmatch(pattern, text.decode()) is not None
                    else:
                        possible = regex.fullmatch(pattern, (text + tok.token_bytes(t)).decode("utf-8", "ignore"),
                                                   partial=True) is not None
                    assert possible == (t in ours), (pattern, text, tok.token_bytes(t), "labkit" if t in ours else "peer")
                token = sorted(ours)[int(torch.randint(len(ours), (1,), generator=gen))]
                if token == tok.eos_id:
                    break
                c.advance(token)
                text += tok.token_bytes(token)
                if token in theirs:
                    peer = index.get_next_state(peer, token)
                else:  # the peer wrongly refused it: follow it no further on this path
                    break
    assert states > 100 and disagreements < states  # mostly equal masks, every difference decided for labkit


def test_the_index_is_cached_on_tokenizer_and_pattern(shakespeare):
    _, tok = shakespeare
    assert token_automaton(tok, "(a|b)") is token_automaton(tok, "(a|b)")
    assert token_automaton(tok, "(a|b)") is not token_automaton(tok, "(a|c)")
    tok2 = labkit.load("shakespeare-draft")[1]
    assert token_automaton(tok2, "(a|b)") is not token_automaton(tok, "(a|b)")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"json_schema": {"type": "string", "format": "date"}}, "'format' is not supported"),
    ({"json_schema": {"type": "integer", "minimum": 3}}, "'minimum'"),
    ({"json_schema": {"$ref": "#/x"}}, "'$ref'"),
    ({"json_schema": {"enum": []}}, "empty enum"),
    ({"json_schema": {"type": "array", "minItems": 3, "maxItems": 1}}, "no array can match"),
    ({"json_schema": {"type": "object", "properties": {}, "required": ["a"]}}, "not in its properties"),
    ({"regex": "a(?!b)"}, "not supported"),
    ({"choices": []}, "choices must be"),
    ({"regex": "a", "choices": ["a"]}, "one constraint at most"),
])
def test_bad_constraints_raise_naming_what_is_wrong(shakespeare, kwargs, fragment):
    model, tok = shakespeare
    with pytest.raises(ValueError, match=re.escape(fragment)):
        labkit.generate(model, tok, "ROMEO:", max_new_tokens=2, **kwargs)


def test_a_constraint_the_tokenizer_cannot_spell_is_refused():
    from labkit.data import paths
    from labkit.tokenizer.gguf import from_gguf

    try:
        tok = from_gguf(paths.smollm2_gguf_path())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    missing = next(b for b in range(256) if bytes([b]) not in {tok.token_bytes(i) for i in range(tok.vocab_size)})
    with pytest.raises(ValueError, match="cannot spell"):
        Constraint.regex(tok, f"\\x{missing:02x}")


def test_speculative_decoding_refuses_constraints(shakespeare):
    model, tok = shakespeare
    draft, _ = labkit.load("shakespeare-draft")
    with pytest.raises(ValueError, match="does not honour constraints"):
        labkit.speculative.generate(model, draft, tok, "ROMEO:", regex="(a|b)")


def test_the_mask_figure_follows_a_constrained_reply(shakespeare):
    model, tok = shakespeare
    steps = labkit.viz.constraint_steps(model, tok, tok.encode("ROMEO:"), make_constraint(tok, json_schema=SCHEMAS[0]))
    text = tok.decode([s["id"] for s in steps if s["id"] != tok.eos_id])
    jsonschema.validate(json.loads(text), SCHEMAS[0])
    assert all(1 <= s["allowed"] <= tok.vocab_size and 0 <= s["p_legal"] <= 1 for s in steps)
    assert min(s["allowed"] for s in steps) == 1  # the key names are forced
    fig = labkit.viz.constraint_masks_figure(steps, tok.vocab_size)
    assert list(fig.data[0].y) == [s["allowed"] for s in steps] and fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError, match="empty"):
        labkit.viz.constraint_masks_figure([], tok.vocab_size)


def test_the_dfa_figure_draws_every_state_and_edge():
    dfa = compile_regex("(yes|no)!")
    fig = labkit.viz.dfa_figure(dfa)
    assert sorted(fig.data[0].text, key=int) == [str(s) for s in range(dfa.n_states)]
    edges = sum(1 for s in range(dfa.n_states) for t in set(dfa.table[s].tolist()) if t >= 0)
    arrows = [a for a in fig.layout.annotations if a.showarrow]
    assert len(arrows) == edges
    labels = sorted(a.text for a in fig.layout.annotations if not a.showarrow)
    assert labels == sorted(["y", "n", "e", "o", "s", "!", "!"])
    accepting = [w for w, s in zip(fig.data[0].marker.line.width, fig.data[0].text) if dfa.accepting[int(s)]]
    assert accepting == [4]
    with pytest.raises(ValueError, match="60 at most"):
        labkit.viz.dfa_figure(compile_regex(JSON_OBJECT))
