"""`labkit generate --model NAME "prompt"`: print a reply and the time each stage took."""
from __future__ import annotations

import statistics


def add_sampling_args(p) -> None:
    """Model and sampling options shared by `generate` and `chat`."""
    p.add_argument("--model", default="smollm2-135m", help="a name from labkit.available_models() (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights and cache dtype")
    p.add_argument("--max-new-tokens", type=int, default=64, help="reply length limit (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", help="stop string (repeatable)")


def sampling_kwargs(args) -> dict:
    return dict(max_new_tokens=args.max_new_tokens, seed=args.seed, stop=args.stop, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty)


def add_parser(sub):
    p = sub.add_parser("generate", help="generate a reply and print a per-stage timing table")
    p.add_argument("prompt", help="the user's message (wrapped in the chat template when the model has one)")
    add_sampling_args(p)
    p.add_argument("--no-chat", action="store_true", help="use the prompt as raw text, without the chat template")
    return p


def timing_table(out) -> str:
    """The stages of a `GenerationOutput` as an aligned text table, with a summary line."""
    rows = [("stage", "start ms", "ms", "")]
    for stage, start, end in out.stages:
        note = f"{len(out.prompt_ids)} prompt tokens" if stage == "prefill" else ""
        rows.append((stage, f"{start * 1e3:.1f}", f"{(end - start) * 1e3:.1f}", note))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip() for r in rows]
    summary = f"TTFT {out.ttft_s * 1e3:.1f} ms"
    if out.itl_s:
        itl = statistics.median(out.itl_s)
        summary += f", {len(out.itl_s)} decode steps, median ITL {itl * 1e3:.1f} ms ({1 / itl:.1f} tok/s)"
    summary += f", total {out.total_s * 1e3:.1f} ms, finish: {out.finish_reason}"
    return "\n".join(lines + [summary])


def run(args) -> int:
    import labkit

    model, tok = labkit.load(args.model, dtype=args.dtype)
    out = labkit.generate(model, tok, args.prompt, chat=False if args.no_chat else None, **sampling_kwargs(args))
    print(out.text)
    print()
    print(timing_table(out))
    return 0
