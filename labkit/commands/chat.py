"""`labkit chat --model NAME`: talk to a chat model in the terminal (/reset, /quit)."""
from __future__ import annotations

import sys

from labkit.commands.generate import add_sampling_args, sampling_kwargs


def add_parser(sub):
    p = sub.add_parser("chat", help="an interactive conversation with a chat model")
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt (default: the template's own)")
    return p


def run(args, stdin=None, stdout=None) -> int:
    import labkit
    from labkit.generation.chat import Chat

    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    model, tok = labkit.load(args.model, dtype=args.dtype)
    chat = Chat(model, tok, system=args.system, **sampling_kwargs(args))
    print(f"Chatting with {args.model}. Commands: /reset (forget the conversation), /quit.", file=stdout)
    while True:
        print("> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip() in ("/quit", "/exit"):
            print(file=stdout)
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            chat.reset()
            print("(conversation forgotten)", file=stdout)
            continue
        for piece in chat.stream(text):
            print(piece, end="", file=stdout, flush=True)
        print(file=stdout)
