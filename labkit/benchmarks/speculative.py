"""Speculative decoding on this machine: every drafter raced against plain decoding of the same target.

Greedy decoding, so every speculative reply must equal the plain one token for token (checked and
printed). Each (target, drafter, γ) first runs on a *calibration* prompt of a kind; its acceptance
α (accepted / tested drafts), its draft cost c (seconds per drafted token / the plain step T(1)) and
the loop's own work per round then predict the race on the measured prompt of that kind, one cost at a
time: the paper's E(γ) / (γ·c + 1), this machine's T(γ+1), the loop's overhead; then the measurement
(decode: the tokens after the first; and the whole reply, prefill included). `labkit.speculative.study`
runs the races. Trees (chain vs tree at the same verified tokens per pass) close the report.
"""
from __future__ import annotations


TITLE = ("Speculative decoding: prompt lookup and three heads (chained, zero-copy, Medusa) on SmolLM2 float32, int8 and "
         "int4, the Shakespeare pair at its fastest format, chains vs trees; predicted from a calibration run vs measured")

PASSAGE = ("The lighthouse keeper climbed the tower every evening at dusk. He trimmed the wick, wound the clockwork "
           "that turned the lens, and wrote the weather in his log: wind, sea, and the ships that passed.")
PASSAGE_CAL = ("The baker rose before the sun to light the oven. She weighed the flour, shaped the loaves on the long "
               "table, and sold the first bread to the carters who passed the door at dawn.")
ACCOUNT = ("class Account:\n    def __init__(self, owner, balance=0):\n        self.owner = owner\n        self.balance = balance\n\n"
           "    def deposit(self, amount):\n        if amount <= 0:\n            raise ValueError(\"amount must be positive\")\n"
           "        self.balance = self.balance + amount\n        return self.balance\n\n    def withdraw(self, amount):\n"
           "        if amount > self.balance:\n            raise ValueError(\"insufficient funds\")\n"
           "        self.balance = self.balance - amount\n        return self.balance\n")
BASKET = ("class Basket:\n    def __init__(self, owner, items=None):\n        self.owner = owner\n        self.items = items or []\n\n"
          "    def add(self, item, count=1):\n        if count <= 0:\n            raise ValueError(\"count must be positive\")\n"
          "        self.items.append((item, count))\n        return len(self.items)\n\n    def remove(self, item):\n"
          "        kept = [pair for pair in self.items if pair[0] != item]\n        removed = len(self.items) - len(kept)\n"
          "        self.items = kept\n        return removed\n")
EDIT = "Rename the attribute {a} to {b} in this code and return the whole code:\n\n{code}"
QUOTE = "Summarise this passage in two sentences, reusing its words:\n\n{p}"
SMOL_PROMPTS = {  # kind: (calibration prompt, measured prompt); none of them is among the heads' training prompts
    "edit code": (EDIT.format(a="items", b="entries", code=BASKET), EDIT.format(a="balance", b="funds", code=ACCOUNT)),
    "summarise": (QUOTE.format(p=PASSAGE_CAL), QUOTE.format(p=PASSAGE)),
    "open chat": ("Tell me about the sun in three sentences.", "Tell me about the moon in three sentences."),
}
BARD_PROMPTS = {"continue a speech": ("JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n",
                                      "ROMEO:\nBut soft, what light through yonder window breaks?\n")}


def _smol_cases(quick: bool) -> list[tuple]:
    """(label, target, tokenizer, {drafter name: (make, γ)}, prompts) for SmolLM2 in each format."""
    import labkit
    from labkit.quant import quantize_model
    from labkit.speculative import MedusaDrafter, MTPDrafter, PromptLookup, ZeroCopyDrafter

    smol, tok = labkit.load("smollm2-135m")
    smol.requires_grad_(False)
    formats = {"int8": quantize_model(smol, bits=8)} if quick else {
        "float32": smol, "int8": quantize_model(smol, bits=8), "int4": quantize_model(smol, bits=4)}
    cases = []
    for fmt, target in formats.items():
        drafters = {f"prompt lookup γ={g}": (PromptLookup, g) for g in ((3,) if quick else (3, 8, "auto"))}
        for name, cls in (("chained MTP head", MTPDrafter), ("zero-copy head", ZeroCopyDrafter), ("Medusa heads", MedusaDrafter)):
            try:
                cls.from_file(target).close()
            except FileNotFoundError as exc:
                print(f"  {name} skipped: {exc}")
                continue
            for g in ((3,) if quick else (2, 3)):
                drafters[f"{name} γ={g}"] = ((lambda c=cls, t=target: c.from_file(t)), g)
        prompts = {k: SMOL_PROMPTS[k] for k in (("edit code", "open chat") if quick else SMOL_PROMPTS)}
        cases.append((f"smollm2 {fmt}", target, tok, drafters, prompts))
    return cases


def _bard_case(quick: bool) -> tuple:
    """The Shakespeare target at its fastest format on this machine, drafted by its 1-layer draft model."""
    import labkit
    from labkit.quant import quantize_model
    from labkit.speculative import DraftModel
    from labkit.speculative.costs import target_pass_s

    bard, tok = labkit.load("shakespeare")
    draft, _ = labkit.load("shakespeare-draft")
    bard.requires_grad_(False)
    draft.requires_grad_(False)
    variants = {"float32": bard, "int8": quantize_model(bard, bits=8, group_size=32),
                "int4": quantize_model(bard, bits=4, group_size=32)}
    t1 = {fmt: target_pass_s(m, 1) for fmt, m in variants.items()}
    fmt = min(t1, key=t1.get)
    print("  Shakespeare target, one-token step: " + ", ".join(f"{f} {t * 1e3:.2f} ms" for f, t in t1.items())
          + f" -> {fmt}")
    drafters = {f"draft model γ={g}": ((lambda: DraftModel(draft)), g) for g in ((2,) if quick else (1, 2, 3, "auto"))}
    return (f"shakespeare {fmt}", variants[fmt], tok, drafters, BARD_PROMPTS), bard, draft, tok


def _trees(bard, draft, tok, n: int) -> list[dict]:
    """Chain vs tree at the same verified tokens per pass, on the float32 Shakespeare pair (exact token for token)."""
    from labkit.speculative import DraftModel, TreeDraftModel, generate_tree

    speech = BARD_PROMPTS["continue a speech"][1]
    rows = []
    for nodes in (3, 5, 8):
        runs = {}
        for name, make in (("chain", lambda: DraftModel(draft)), ("tree", lambda: TreeDraftModel(draft, width=2))):
            out = generate_tree(bard, make(), tok, speech, max_nodes=nodes, max_new_tokens=n, compare=name == "chain")
            runs[name] = (out, out.wall_s)  # the plain comparison runs after, untimed
        chain, tree = runs["chain"][0], runs["tree"][0]
        rows.append({"nodes": nodes, "chain_accepted_per_pass": sum(chain.accepted_per_pass) / len(chain.accepted_per_pass),
                     "tree_accepted_per_pass": sum(tree.accepted_per_pass) / len(tree.accepted_per_pass),
                     "chain_s": runs["chain"][1], "tree_s": runs["tree"][1],
                     "same_tokens": chain.plain["same_tokens"] and chain.token_ids == tree.token_ids})
        r = rows[-1]
        print(f"  trees, {nodes} verified tokens per pass: accepted per pass chain {r['chain_accepted_per_pass']:.2f}, "
              f"tree {r['tree_accepted_per_pass']:.2f}; wall {r['chain_s']:.2f} s vs {r['tree_s']:.2f} s; "
              f"same tokens as plain: {r['same_tokens']}")
    return rows


def run(quick: bool = False) -> dict:
    import torch

    from labkit.speculative import study
    from labkit.speculative.costs import relative_costs

    n, rounds = (24, 1) if quick else (48, 2)
    report = {"threads": torch.get_num_threads(), "new_tokens": n, "rounds": rounds, "cases": {}, "t_rel": {}}
    cases = []
    try:
        bard_case, bard, draft, bard_tok = _bard_case(quick)
        cases.append(bard_case)
    except FileNotFoundError as exc:
        print(f"  Shakespeare pair skipped: {exc}")
        bard = None
    try:
        cases = _smol_cases(quick) + cases
    except FileNotFoundError as exc:
        print(f"  SmolLM2 skipped: {exc}")
    for label, target, tok, drafters, prompts in cases:
        _, t_rel = relative_costs(target, ks=range(2, 10), repeat=2 if quick else 3)
        report["t_rel"][label] = t_rel
        print(f"  {label}: T(k)/T(1) for k = 2..9: " + " ".join(f"{t_rel[k]:.2f}" for k in range(2, 10)))
        print(f"    {'prompt / drafter':38s} {'α cal':>5s} {'c':>6s} {'loop':>5s} | {'paper':>6s} {'T(k)':>6s} {'+loop':>6s} "
              f"| {'decode':>6s} {'reply':>6s} same")
        for kind, (cal_prompt, prompt) in prompts.items():
            cal = study.race(target, tok, cal_prompt, drafters, n=n, rounds=1, t_rel=t_rel)
            measured = study.race(target, tok, prompt, drafters, n=n, rounds=rounds, t_rel=t_rel)
            for name in drafters:
                c, m = cal[name], measured[name]
                p = study.predict(c, m["gamma"], t_rel) if isinstance(m["gamma"], int) else None  # auto: no single γ
                row = {k: v for k, v in m.items() if k != "out"} | {"calibration_alpha": c["alpha"], "calibration_c": c["c"],
                                                                   "calibration_overhead": c["overhead"], "predicted": p}
                report["cases"][f"{label} / {kind} / {name}"] = row
                pred = (f"{p['paper']:5.2f}x {p['with T(k)']:5.2f}x {p['with overhead']:5.2f}x" if p else f"{'-':>6s} {'-':>6s} {'-':>6s}")
                print(f"    {kind + ' / ' + name:38s} {c['alpha']:5.2f} {c['c']:6.3f} {c['overhead']:5.2f} | {pred} | "
                      f"{m['decode_speedup']:5.2f}x {m['speedup']:5.2f}x {m['same_as_plain']}")
    if bard is not None:
        report["trees"] = _trees(bard, draft, bard_tok, 48 if quick else 96)
    return report
