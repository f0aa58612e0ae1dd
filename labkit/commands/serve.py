"""`labkit serve --model NAME`: an OpenAI-compatible API (chat and completions) on 127.0.0.1 (Ctrl-C stops it)."""
from __future__ import annotations

import os
import sys
import threading


def _kv_memory(text: str):
    """'256MiB', '1GB', '268435456' (bytes) or '0.1' (a fraction of free memory)."""
    try:
        value = float(text)
    except ValueError:
        return text  # a size with a unit: Server checks it
    return value if 0 < value < 1 else int(value)


def _spec_budget(text: str):
    """A speculation budget by name, checked here so that a bad value is an argparse error naming the flag."""
    import argparse

    from labkit.serving.engine.budget import spec_budget

    try:
        spec_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("spec_budget must be", "must be")) from None
    return text


def add_parser(sub):
    from labkit.serving.http.server import DEFAULT_KV_MEMORY

    p = sub.add_parser("serve", help="serve a model over HTTP on 127.0.0.1 (OpenAI chat-completions format)")
    p.add_argument("--model", default="smollm2-135m", help="a name from labkit.available_models() (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and cache dtype")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s; others need "
                   "--allow-remote)")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host other than 127.0.0.1 (prints a warning)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port; default: %(default)s)")
    p.add_argument("--policy", default="chunked", choices=["static", "continuous", "orca", "chunked"], help="batching policy")
    p.add_argument("--max-batch", type=int, default=8, help="most requests decoding together (default: %(default)s)")
    p.add_argument("--token-budget", type=int, default=64, help="most tokens per forward pass (default: %(default)s)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (default: %(default)s)")
    p.add_argument("--kv-memory", type=_kv_memory, default=DEFAULT_KV_MEMORY,
                   help="memory for the KV pool: bytes, '512MiB', or a fraction of free memory like 0.1 "
                        "(default: %(default)s)")
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks in the pool (overrides --kv-memory)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="turn off automatic prefix caching (requests sharing a prompt prefix reuse its KV blocks)")
    p.add_argument("--max-waiting", type=int, default=64, help="requests queued before new ones get 429 "
                   "(default: %(default)s)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds a request may take before it is "
                   "ended (default: %(default)s)")
    p.add_argument("--max-tokens-limit", type=int, default=1024, help="largest max_tokens a request may ask for "
                   "(default: %(default)s)")
    p.add_argument("--speculative", default=None, choices=["prompt-lookup", *HEADS],
                   help="draft tokens and verify them in the batched passes (default: no speculation): prompt lookup, or "
                        "a drafting head trained for SmolLM2 (mtp, zero-copy, medusa), each request drafting from its "
                        "own last verified hidden state")
    p.add_argument("--spec-budget", type=_spec_budget, default=None,
                   help="with --speculative: drafted tokens verified per request and pass: off, fixed:N, vllm:B[:N] "
                        "(none from B running requests) or auto (from measured acceptance and pass cost; the default)")
    return p


HEADS = ("mtp", "zero-copy", "medusa")


def make_drafter(name: str | None, model):
    """The drafter `--speculative name` serves: prompt lookup, or a head from its file for `model` (the heads trained
    for SmolLM2 are in data/; another model has none: FileNotFoundError or ValueError saying so)."""
    if name is None:
        return None
    from labkit.speculative import PromptLookup
    from labkit.speculative.heads import MedusaDrafter, ZeroCopyDrafter
    from labkit.speculative.mtp import MTPDrafter

    if name == "prompt-lookup":
        return PromptLookup()
    return {"mtp": MTPDrafter, "zero-copy": ZeroCopyDrafter, "medusa": MedusaDrafter}[name].from_file(model)


def port_taken(host: str, port: int) -> bool:
    """True when another process holds `port` on `host` (checked by binding it, before the model loads)."""
    import errno
    import socket

    if port == 0:
        return False
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def run(args, ready=None) -> int:
    import labkit
    from labkit import threads
    from labkit.serving.http.server import Server

    if args.spec_budget is not None and args.speculative is None:
        print(f"labkit serve: --spec-budget {args.spec_budget} needs --speculative (without it the server does not "
              "draft, so a budget would do nothing)", file=sys.stderr)
        return 2
    if port_taken(args.host, args.port):
        print(f"labkit serve: port {args.port} on {args.host} is taken (another server?); choose a free one with "
              f"--port N", file=sys.stderr)
        return 2

    model, tok = labkit.load(args.model, dtype=args.dtype)
    if args.spec_budget == "off":  # no drafting: no drafter, and a head's hooks never touch the model
        args.speculative = args.spec_budget = None
    try:
        drafter = make_drafter(args.speculative, model)
    except (FileNotFoundError, ValueError) as exc:
        print(f"labkit serve: --speculative {args.speculative}: {exc}", file=sys.stderr)
        return 2
    server = Server(model, tok, args.model, host=args.host, port=args.port, allow_remote=args.allow_remote,
                    kv_memory=args.kv_memory, max_waiting=args.max_waiting, request_timeout=args.request_timeout,
                    max_tokens_limit=args.max_tokens_limit, policy=args.policy, max_batch=args.max_batch,
                    token_budget=args.token_budget, block_size=args.block_size, num_blocks=args.kv_blocks,
                    prefix_cache=args.prefix_cache, drafter=drafter, spec_budget=args.spec_budget)
    stop = ready if ready is not None else threading.Event()
    if ready is None and threading.current_thread() is threading.main_thread():
        import signal  # ctrl-c and a plain kill stop the server, even where the parent process ignored them (a
        # child inherits an ignored SIGINT, and Python then leaves it ignored: a pytest-xdist worker, a `cmd &`)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:  # a ctrl-c, however early, stops the engine's thread (it would keep the process alive)
        url = server.start()
        budget = args.spec_budget or "auto"
        print(f"Serving {args.model} ({args.policy} batching, up to {args.max_batch} requests, KV pool of "
              f"{server.kv_tokens} tokens, prefix caching {'on' if args.prefix_cache else 'off'}"
              f"{f', speculation {args.speculative} ({budget})' if drafter else ''}) at {url}", flush=True)
        print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
              f"-d '{{\"model\": \"{args.model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'",
              flush=True)
        print(f"  threads: {threads.status()}", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print("stopped", flush=True)
    if ready is None:  # the command itself: after a stop nothing may keep the process alive
        left = [t.name for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]
        if left:  # a thread that never ends would hold the interpreter's exit forever: name it, and exit
            print(f"labkit serve: threads still running after the stop ({', '.join(left)}); exiting anyway",
                  file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(0)
    return 0
