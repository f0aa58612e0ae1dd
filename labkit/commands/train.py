"""`labkit train --model shakespeare|shakespeare-csa|shakespeare-draft|smollm2-mtp|smollm2-heads [--quick]`: train the lab's own models and heads."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("train", help="train the lab's Shakespeare target (dense or compressed attention) or draft from scratch, or SmolLM2's MTP head "
                                     "(writes data/NAME.safetensors)")
    p.add_argument("--model", required=True, choices=["shakespeare", "shakespeare-csa", "shakespeare-draft", "smollm2-mtp", "smollm2-heads"],
                   help="which model to train (shakespeare-csa: the target with compressed sparse attention, labkit.model.compressed; smollm2-mtp: the chained drafting head on frozen SmolLM2, labkit.train.mtp; "
                        "smollm2-heads: its zero-copy head and parallel Medusa heads, labkit.train.heads)")
    p.add_argument("--quick", action="store_true", help="a tiny version in about a minute (what the tests train)")
    p.add_argument("--out", metavar="DIR", help="where to write the checkpoint (default data/; --quick defaults to .build/train)")
    p.add_argument("--steps", type=int, help="override the recipe's number of steps")
    p.add_argument("--seed", type=int, help="override the recipe's seed")
    p.add_argument("--distill", type=float, help="weight of the distillation term for the draft (0 = none; default 0.5)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    return p


def run(args) -> int:
    from pathlib import Path

    import torch

    from labkit.data import paths
    from labkit.train.run import checkpoint_path, train_model

    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else (paths.ROOT / ".build" / "train" if args.quick else paths.DATA_DIR)
    if args.model == "smollm2-mtp":
        from labkit.train.mtp import train_mtp

        out.mkdir(parents=True, exist_ok=True)
        record = train_mtp(quick=args.quick, out_dir=out)
        print(f"MTP head: {record['head_params']:,} parameters over {record['vocab']} tokens ({record['vocab_coverage']:.1%} "
              f"of the backbone's own tokens); {record['prompts']} prompts, {record['conversations_tokens']:,} tokens; "
              f"final loss {record['losses'][-1]:.3f}; held-out top-1 agreement {record['val_agreement']:.1%}")
        print(f"wrote {record['path']}")
        return 0
    if args.model == "smollm2-heads":
        from labkit.train.heads import train_heads

        out.mkdir(parents=True, exist_ok=True)
        for kind, record in train_heads(quick=args.quick, out_dir=out).items():
            by_head = record.get("val_agreement_by_head")
            extra = f" (by head: {' '.join(f'{a:.1%}' for a in by_head)})" if by_head else ""
            print(f"{kind} head: {record['head_params']:,} parameters over {record['vocab']} tokens; final loss "
                  f"{record['losses'][-1]:.3f}; held-out top-1 agreement {record['val_agreement']:.1%}{extra}")
            print(f"wrote {record['path']}")
        return 0
    record = train_model(args.model, quick=args.quick, out_dir=out, seed=args.seed, distill=args.distill, steps=args.steps)
    name = record["model"]
    print(f"{name}: {record['n_params']:,} parameters, {record['steps']} steps, {record['tokens']:,} tokens "
          f"in {record['wall_s']:.0f} s ({record['tokens'] / record['wall_s']:,.0f} tokens/s)")
    print(f"final train loss {record['final_train_loss']:.3f}; validation loss {record['val_loss']:.4f} nats/token, "
          f"{record['val_bits_per_byte']:.3f} bits/byte")
    print(f"wrote {checkpoint_path(name, out)} and {checkpoint_path(name, out).with_suffix('.json')}")
    if out == paths.DATA_DIR:
        print("record the new checksums with: python -m labkit.data.files write")
    return 0
