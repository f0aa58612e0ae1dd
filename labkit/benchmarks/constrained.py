"""Constrained decoding's costs: compiling a format for a vocabulary, and the mask at each step, next to outlines-core.

Both sides get the same regex (a JSON Schema written as one by `labkit.sampling.json_schema`)
and the same vocabulary (every non-special token's bytes). Compile: labkit's regex -> DFA ->
vocabulary index (token-level liveness over every state reachable by tokens, so every state's
row is built) against outlines-core's `Index(regex, vocabulary)`. Per token: one step of a
random walk through the automaton, i.e. the boolean mask over the vocabulary for the current
state and the move to the next (labkit: `Constraint.apply` on a logits row + `advance`;
outlines-core: `get_allowed_tokens` into a mask + `get_next_state`). outlines-core is optional
(`pip install outlines-core`); without it the bench measures labkit alone.
"""
from __future__ import annotations


from labkit.measure.clock import now as clock_now

TITLE = "Constrained decoding: compile time and microseconds per token, labkit vs outlines-core, two vocabularies"

_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                                            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
           "required": ["name", "age"]}


def _walk_labkit(tok, pattern, steps, seed):
    import torch

    from labkit.sampling.constrained import Constraint

    c, gen = Constraint.regex(tok, pattern), torch.Generator().manual_seed(seed)
    logits = torch.zeros(tok.vocab_size)
    n, start = 0, clock_now()
    for _ in range(steps):
        masked = c.apply(logits)
        legal = torch.nonzero(masked > float("-inf")).flatten()
        token = int(legal[torch.randint(len(legal), (1,), generator=gen)])
        n += 1
        if token == tok.eos_id:  # a complete reply: start another
            c = Constraint.regex(tok, pattern)
            continue
        c.advance(token)
    return (clock_now() - start) / n


def _walk_peer(index, vocab_size, eos, steps, seed):
    import torch

    state, gen = index.get_initial_state(), torch.Generator().manual_seed(seed)
    n, start = 0, clock_now()
    for _ in range(steps):
        allowed = index.get_allowed_tokens(state)
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[allowed] = True
        legal = torch.nonzero(mask).flatten()
        token = int(legal[torch.randint(len(legal), (1,), generator=gen)])
        n += 1
        if token == eos:
            state = index.get_initial_state()
            continue
        state = index.get_next_state(state, token)
    return (clock_now() - start) / n


def run(quick: bool = False) -> dict:
    import labkit
    from labkit.data import paths
    from labkit.sampling import constrained
    from labkit.sampling.constrained import TokenAutomaton
    from labkit.sampling.json_schema import JSON_OBJECT, schema_to_regex
    from labkit.sampling.regex_dfa import compile_regex
    from labkit.tokenizer.gguf import from_gguf

    try:
        import outlines_core
    except ImportError:
        outlines_core = None
        print("  outlines-core is not installed (pip install outlines-core): labkit alone")
    toks = {"shakespeare": labkit.load("shakespeare")[1]}
    try:
        toks["smollm2-135m"] = from_gguf(paths.smollm2_gguf_path())
    except FileNotFoundError as exc:
        print(f"  {exc}: Shakespeare's vocabulary only")
    formats = {"schema": schema_to_regex(_SCHEMA), "json_object": JSON_OBJECT}
    steps = 200 if quick else 1000
    rows = []
    print(f"  {'vocabulary':14s} {'format':12s} {'labkit compile':>15s} {'peer compile':>13s} "
          f"{'labkit us/token':>16s} {'peer us/token':>14s}")
    for tok_name, tok in toks.items():
        for fmt, pattern in formats.items():
            if quick and fmt == "json_object" and tok_name != "shakespeare":
                continue
            t0 = clock_now()
            auto = TokenAutomaton(tok, compile_regex(pattern))
            compile_s = clock_now() - t0
            constrained._CACHE.setdefault(tok, {})[pattern] = auto  # the walk reuses this index
            us = _walk_labkit(tok, pattern, steps, 0) * 1e6
            row = {"vocabulary": tok_name, "vocab_size": tok.vocab_size, "format": fmt, "labkit_compile_s": compile_s,
                   "labkit_us_per_token": us, "dfa_states": auto.dfa.n_states}
            if outlines_core is not None:
                vocab = {}
                for i in range(tok.vocab_size):
                    if not tok.is_special(i):
                        vocab.setdefault(tok.token_bytes(i), []).append(i)
                t0 = clock_now()
                index = outlines_core.Index(pattern, outlines_core.Vocabulary(tok.eos_id, vocab))
                row["peer_compile_s"] = clock_now() - t0
                row["peer_us_per_token"] = _walk_peer(index, tok.vocab_size, tok.eos_id, steps, 0) * 1e6
            rows.append(row)
            peer_c = f"{row['peer_compile_s']:12.2f}s" if "peer_compile_s" in row else f"{'-':>13s}"
            peer_u = f"{row['peer_us_per_token']:14.0f}" if "peer_us_per_token" in row else f"{'-':>14s}"
            print(f"  {tok_name:14s} {fmt:12s} {compile_s:14.2f}s {peer_c} {us:16.0f} {peer_u}")
    return {"rows": rows, "steps": steps}
