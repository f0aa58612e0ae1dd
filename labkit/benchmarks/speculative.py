"""Speculative decoding on this machine: acceptance, tokens per target call, measured and predicted speed-up.

Greedy decoding, so every speculative reply must equal the plain one token for token (it is
checked and printed). The speed-up is plain wall time / speculative wall time, medians of
runs interleaved side by side. The prediction uses the measured acceptance α (accepted /
tested draft tokens; verification stops testing at the first rejection) and costs:
a draft step c and a target pass over k tokens T(k), both relative to one plain step T(1):
E(γ) / (γ·c + T(γ+1)) with E(γ) = (1 − α^(γ+1)) / (1 − α).
"""
from __future__ import annotations


TITLE = ("Speculative decoding: acceptance, tokens/call, speed-up measured vs predicted (draft model, layer skip, "
         "prompt lookup on the float32, int8 and int4 targets, MTP head)")

PASSAGE = ("The lighthouse keeper climbed the tower every evening at dusk. He trimmed the wick, wound the clockwork "
           "that turned the lens, and wrote the weather in his log: wind, sea, and the ships that passed.")
CODE = "def total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n    return s\n"
SMOL_PROMPTS = {
    "open chat": "Tell me about the moon in three sentences.",
    "summarise": f"Summarise this passage in two sentences, reusing its words:\n\n{PASSAGE}",
    "edit code": f"Rename the variable s to running_sum in this code and return the whole code:\n\n{CODE}",
}
BARD_PROMPTS = {"continue a speech": "ROMEO:\nBut soft, what light through yonder window breaks?\n"}


def _case(target, make_drafter, tok, prompt, gammas, n, rounds, chat, c, t_rel) -> list[dict]:
    from labkit.speculative.costs import measure_speedups, predicted_speedup

    rows = measure_speedups(target, make_drafter, tok, prompt, gammas, n, rounds, chat)
    for row in rows:
        if isinstance(row["gamma"], int):
            row["predicted"] = predicted_speedup(row["alpha"], row["gamma"], c, t_rel)
    return rows


def _mtp_pairs(smol, tok) -> list[tuple]:
    """SmolLM2 with its MTP head, drafting over the frequent tokens it was trained on, and over all of them."""
    import torch

    from labkit.speculative import MTPDrafter, MTPHead

    try:
        frequent = MTPDrafter.from_file(smol)
    except FileNotFoundError as exc:
        print(f"  MTP head skipped: {exc}")
        return []
    full_head = MTPHead(smol.config, vocab_ids=torch.arange(smol.config.vocab_size))
    full_head.load_state_dict({k: v for k, v in frequent.head.state_dict().items() if k != "vocab_ids"}, strict=False)
    full = MTPDrafter(smol, full_head.to(smol.dtype).eval().requires_grad_(False))
    k = len(frequent.head.vocab_ids)
    return [(f"smollm2 + MTP head ({k} frequent tokens)", smol, tok, lambda: frequent, SMOL_PROMPTS, None, frequent.head),
            (f"smollm2 + MTP head (all {smol.config.vocab_size} tokens)", smol, tok, lambda: full, SMOL_PROMPTS, None,
             full.head)]


def _fast_targets(smol, tok) -> list[tuple]:
    """SmolLM2 quantized to int8 and int4 with bf16 activations (the packed kernels, the lab's fastest formats), each
    drafted by prompt lookup and measured against plain decoding of that same quantized target."""
    from labkit.quant import quantize_model
    from labkit.speculative import PromptLookup

    smol.requires_grad_(False)
    pairs = []
    for bits in (8, 4):
        target = quantize_model(smol, bits=bits)
        pairs.append((f"smollm2 int{bits} (bf16 activations) + prompt lookup", target, tok, PromptLookup, SMOL_PROMPTS,
                      None, None))
    return pairs


def run(quick: bool = False) -> dict:
    import torch

    import labkit
    from labkit.speculative import DraftModel, LayerSkip, PromptLookup
    from labkit.speculative.costs import relative_costs

    n, rounds = (24, 1) if quick else (48, 3)
    gammas = [2, 4] if quick else [1, 2, 4, 6, "auto", "heuristic"]
    report = {"threads": torch.get_num_threads(), "new_tokens": n, "rounds": rounds, "cases": {}}
    pairs = []
    try:
        bard, bard_tok = labkit.load("shakespeare")
        bard_draft, _ = labkit.load("shakespeare-draft")
        pairs.append(("shakespeare + draft model", bard, bard_tok, lambda: DraftModel(bard_draft), BARD_PROMPTS, False,
                      bard_draft))
        half = bard.config.n_layers // 2
        pairs.append((f"shakespeare + its first {half} layers", bard, bard_tok, lambda: LayerSkip(bard, half),
                      BARD_PROMPTS, False, ("layers", half)))
    except FileNotFoundError as exc:
        print(f"  Shakespeare pair skipped: {exc}")
    try:
        smol, smol_tok = labkit.load("smollm2-135m")
        pairs.append(("smollm2 + prompt lookup", smol, smol_tok, PromptLookup, SMOL_PROMPTS, None, None))
        pairs += _fast_targets(smol, smol_tok)
        pairs += _mtp_pairs(smol, smol_tok)
    except FileNotFoundError as exc:
        print(f"  SmolLM2 skipped: {exc}")
    for label, target, tok, make, prompts, chat, draft_model in pairs:
        if isinstance(draft_model, tuple):  # early exit: a draft step runs that share of the layers
            c, t_rel = relative_costs(target, layers=draft_model[1])
        else:
            c, t_rel = relative_costs(target, draft_model)
        print(f"  {label}: T(k)/T(1) for k = 2..8: " + " ".join(f"{t_rel[k]:.2f}" for k in range(2, 9))
              + f"; draft step c = {c:.3f} T(1)")
        for kind, prompt in prompts.items():
            rows = _case(target, make, tok, prompt, gammas, n, rounds, chat, c, t_rel)
            report["cases"][f"{label} / {kind}"] = {"rows": rows, "t_rel": t_rel, "c": c}
            for r in rows:
                pred = f"{r['predicted']:.2f}x" if "predicted" in r else "  -  "
                print(f"    {kind:18s} gamma {str(r['gamma']):>4s}: alpha {r['alpha']:.2f}, {r['tokens_per_call']:.2f} tokens/call, "
                      f"speed-up {r['speedup']:.2f}x (predicted {pred}), same tokens as plain: {r['same_as_plain']}")
    return report
