"""`labkit serve --model NAME`: an OpenAI-style chat-completions endpoint on 127.0.0.1 (Ctrl-C stops it)."""
from __future__ import annotations

import threading


def add_parser(sub):
    p = sub.add_parser("serve", help="serve a model over HTTP on 127.0.0.1 (OpenAI chat-completions format)")
    p.add_argument("--model", default="smollm2-135m", help="a name from labkit.available_models() (default: %(default)s)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and cache dtype")
    p.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (0: any free port; default: %(default)s)")
    p.add_argument("--policy", default="chunked", choices=["static", "continuous", "chunked"], help="batching policy")
    p.add_argument("--max-batch", type=int, default=8, help="most requests decoding together (default: %(default)s)")
    p.add_argument("--token-budget", type=int, default=64, help="most tokens per forward pass (default: %(default)s)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens (default: %(default)s)")
    p.add_argument("--kv-blocks", type=int, default=None, help="KV blocks in the pool (default: max-batch full contexts)")
    return p


def run(args, ready=None) -> int:
    import labkit
    from labkit.serving.server import Server

    model, tok = labkit.load(args.model, dtype=args.dtype)
    server = Server(model, tok, args.model, port=args.port, policy=args.policy, max_batch=args.max_batch,
                    token_budget=args.token_budget, block_size=args.block_size, num_blocks=args.kv_blocks)
    url = server.start()
    print(f"Serving {args.model} ({args.policy} batching, up to {args.max_batch} requests) at {url}", flush=True)
    print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{args.model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'", flush=True)
    stop = ready if ready is not None else threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        print("stopped", flush=True)
    return 0
