"""A soak test of `labkit serve`: thousands of mixed requests from concurrent clients, and whether the server stays
the same from the first window to the last.

The server runs as its own process (`labkit serve`, prompt lookup with the `auto` budget), so its memory is its
own: RSS read from /proc. The clients send a seeded mix (`MIX`): short and long prompts, streamed and not,
chat and completions, cancels (a streamed request closed after its first events), disconnects (a request sent
and the socket closed at once) and invalid requests (bad JSON, a negative max_tokens, a wrong type). After
every window of `WINDOW` finished requests it records the server's RSS, its open slots (/metrics: running,
waiting, KV blocks in use) and the latency of the window's complete requests (p50, p99, each with its
order-statistic interval), and every non-2xx by status.

What it checks (`measure.claim`): RSS after the first window grows at most 5 %; p99 latency of the last
`P99_SPAN` finished requests at most 1.2x the first's (the ratio's interval from the two p99 intervals at 97.5 %
each: a window of 500, about 410 complete requests, cannot bound a p99 from above at that level, 1,000 can); no
request lost or hung (every valid request answered in time, every cancel and disconnect leaving nothing open);
every invalid one answered 4xx.

    labkit bench --only soak                  # 5,000 requests on the Shakespeare model, 16 clients
    python -m labkit.benchmarks.soak --requests 10000 --json soak.json   # longer: the p99s over 2,000 each
"""
from __future__ import annotations

import http.client
import json
import random
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from labkit.measure.clock import now

TITLE = "Soak: labkit serve under thousands of mixed requests (RSS, open slots, p50/p99 per window, every non-2xx)"

WINDOW = 500
P99_SPAN = 1000  # finished requests at each end of the run whose p99 latencies are compared (a fifth of a longer run)
MIX = (("chat", 0.40), ("chat-stream", 0.25), ("completion", 0.10), ("completion-stream", 0.07), ("cancel", 0.06),
       ("disconnect", 0.04), ("invalid", 0.08))
INVALID = (b"{not json", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}',
           b'{"model": "m", "messages": "hello"}', b'{"model": "m", "prompt": 12.5}')
TIMEOUT_S = 120.0  # a request not answered in this long is hung


def plan(n: int, seed: int = 0) -> list[dict]:
    """The seeded sequence of `n` requests: kind, prompt length ("short" or "long") and max_tokens."""
    rng = random.Random(seed)
    kinds, weights = zip(*MIX)
    return [{"i": i, "kind": rng.choices(kinds, weights)[0], "long": rng.random() < 0.25,
             "max_tokens": rng.randint(4, 24), "invalid": rng.randrange(len(INVALID))} for i in range(n)]


def _body(req: dict, text: str, model: str) -> bytes:
    if req["kind"] == "invalid":
        return INVALID[req["invalid"]].replace(b'"m"', json.dumps(model).encode())
    stream = req["kind"] in ("chat-stream", "completion-stream", "cancel")
    body = {"model": model, "max_tokens": req["max_tokens"], "stream": stream, "temperature": 0.0}
    if req["kind"].startswith("completion"):
        body["prompt"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
    return json.dumps(body).encode()


def send(port: int, req: dict, text: str, model: str) -> dict:
    """Send one request as its kind says; what happened: status (None for a deliberate drop), latency, events."""
    path = "/v1/completions" if req["kind"].startswith("completion") else "/v1/chat/completions"
    start = now()
    if req["kind"] == "disconnect":
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            body = _body(req, text, model)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                      f"{len(body)}\r\n\r\n".encode() + body)
        return {**req, "status": None, "latency_s": now() - start}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("POST", path, body=_body(req, text, model), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        events = 0
        if req["kind"] == "cancel" and resp.status == 200:
            while events < 2 and resp.readline():
                events += 1
            return {**req, "status": 200, "latency_s": now() - start, "events": events}
        resp.read()
        return {**req, "status": resp.status, "latency_s": now() - start}
    except (OSError, http.client.HTTPException) as exc:
        return {**req, "status": -1, "error": f"{type(exc).__name__}: {exc}", "latency_s": now() - start}
    finally:
        conn.close()


def rss_bytes(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def gauges(port: int) -> dict:
    """The server's open slots from /metrics: requests running and waiting, share of KV blocks in use."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    want = {"labkit:num_requests_running": "running", "labkit:num_requests_waiting": "waiting",
            "labkit:kv_cache_usage_perc": "kv_used"}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[want[name]] = float(value)
    return out


def _complete(rows: list[dict]) -> list[float]:
    """The sorted latencies of the rows that are whole requests answered 200 (not invalid, cancelled or dropped)."""
    return sorted(r["latency_s"] for r in rows if r["kind"] not in ("invalid", "cancel", "disconnect")
                  and r["status"] == 200)


def window_summary(rows: list[dict]) -> dict:
    """One window's figures: requests, complete ones' latency p50 and p99 with intervals, non-2xx by status."""
    from labkit.measure.stats import median_interval, quantile, quantile_interval

    done = _complete(rows)
    bad: dict = {}
    for r in rows:
        if r["status"] is not None and not 200 <= r["status"] < 300:
            bad[str(r["status"])] = bad.get(str(r["status"]), 0) + 1
    return {"requests": len(rows), "complete": len(done), "p50_s": quantile(done, 0.5) if done else None,
            "p50_interval": median_interval(done) if done else None, "p99_s": quantile(done, 0.99) if done else None,
            "p99_interval": quantile_interval(done, 0.99, 0.975) if done else None, "non_2xx": bad}


def verdicts(windows: list[dict], rows: list[dict], after: dict, span: int = P99_SPAN) -> list:
    """The soak's four claims (see the module docstring), from `measure.claim`; `rows` in the order they finished,
    `span`: how many of them at each end the p99 comparison reads."""
    from labkit import measure
    from labkit.measure.stats import quantile, quantile_interval

    rss = [w["rss_bytes"] for w in windows]
    growth = max(rss[1:]) / rss[0] - 1 if len(rss) > 1 else 0.0
    span = min(span, len(rows) // 2)
    early, late = _complete(rows[:span]), _complete(rows[-span:])
    first, last = quantile_interval(early, 0.99, 0.975), quantile_interval(late, 0.99, 0.975)
    ratio = quantile(late, 0.99) / quantile(early, 0.99)
    lost = sum(1 for r in rows if r["status"] == -1 or (r["kind"] not in ("invalid", "cancel", "disconnect")
                                                          and r["status"] != 200))
    lost += int(after.get("running", 0) + after.get("waiting", 0))  # anything still open once every client is done
    invalid_not_4xx = sum(1 for r in rows if r["kind"] == "invalid" and not (r["status"] and 400 <= r["status"] < 500))
    return [
        measure.claim("RSS growth after the first window", growth, high=0.05, exact=True,
                      why="RSS is a size, read once per window"),
        measure.claim(f"p99 latency, last {span} requests / first {span}", ratio, high=1.2,
                      interval=(last[0] / first[1], last[1] / first[0]),
                      why="each p99's order-statistic interval at 97.5 %: the ratio's at 95 % or more"),
        measure.claim("requests lost, hung or left open", lost, high=0, exact=True),
        measure.claim("invalid requests not answered 4xx", invalid_not_4xx, high=0, exact=True)]


def _texts() -> tuple[list[str], list[str]]:
    from labkit.benchmarks.serving_live import PROMPTS
    from labkit.data.paths import data_path

    play = data_path("shakespeare_val.txt").read_text()
    return PROMPTS, [play[i * 700:i * 700 + 600] for i in range(32)]  # long: about 230 tokens each


def _start(model: str, port: int, max_batch: int):
    cmd = [sys.executable, "-m", "labkit", "serve", "--model", model, "--port", str(port), "--policy", "chunked",
           "--max-batch", str(max_batch), "--speculative", "prompt-lookup", "--spec-budget", "auto",
           "--max-waiting", "256"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = now() + 180
    for line in proc.stdout:  # the startup line says where it serves
        if "Serving" in line and " at http" in line:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep draining
            return proc
        if now() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"labkit serve did not start: {' '.join(cmd)}")


def _settled(port: int, timeout_s: float = 15.0) -> dict:
    """The gauges once nothing runs or waits (a cancel's abort lands within the server's poll), or at the timeout."""
    deadline = now() + timeout_s
    while True:
        g = gauges(port)
        if g.get("running", 0) + g.get("waiting", 0) == 0 or now() > deadline:
            return g
        threading.Event().wait(0.2)


def run(quick: bool = False, requests: int | None = None, clients: int = 16, model: str = "shakespeare",
        window: int | None = None) -> dict:
    n = requests or (600 if quick else 5000)
    window = window or (100 if quick else WINDOW)
    if n < 2 * window:
        raise ValueError(f"requests must be at least two windows of {window}, got {n}")
    with socket.socket() as s:  # a free port, given to the server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    short, long = _texts()
    proc = _start(model, port, max_batch=8)
    rows, windows, lock = [], [], threading.Lock()
    start = now()

    def one(req):
        text = long[req["i"] % len(long)] if req["long"] else short[req["i"] % len(short)]
        row = send(port, req, text, model)
        with lock:
            rows.append(row)
            if len(rows) % window == 0:
                w = window_summary(rows[-window:])
                w.update(done=len(rows), seconds=now() - start, rss_bytes=rss_bytes(proc.pid), **gauges(port))
                windows.append(w)
                print(f"  {w['done']:6d} done {w['seconds']:7.1f} s  RSS {w['rss_bytes'] / 2**20:7.1f} MiB  running "
                      f"{w.get('running', 0):2.0f} waiting {w.get('waiting', 0):3.0f} KV {w.get('kv_used', 0):5.1%}  "
                      f"p50 {w['p50_s']:6.3f} s p99 {w['p99_s']:6.3f} s  non-2xx {w['non_2xx']}", flush=True)

    try:
        print(f"  labkit serve --model {model} (pid {proc.pid}), prompt lookup, auto budget; {n} requests from "
              f"{clients} clients, windows of {window}", flush=True)
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, plan(n)))
        after = _settled(port)
        after_rss = rss_bytes(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    claims = verdicts(windows, rows, after, span=max(P99_SPAN, n // 5))
    for c in claims:
        print(f"  {c}")
    return {"requests": n, "clients": clients, "model": model, "window": window, "windows": windows,
            "after": {**after, "rss_bytes": after_rss}, "claims": [c.as_dict() for c in claims],
            "kinds": {k: sum(1 for r in rows if r["kind"] == k) for k, _ in MIX},
            "errors": sorted({r["error"] for r in rows if "error" in r})[:20]}


def main(argv=None) -> int:
    import argparse

    from labkit.benchmarks.loading import write_report
    from labkit.costmodel.cpu import cpu_info, describe

    p = argparse.ArgumentParser(description=TITLE)
    p.add_argument("--requests", type=int, default=5000, help="requests in all (default: %(default)s)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default: %(default)s)")
    p.add_argument("--json", metavar="FILE", help="also write the windows and claims to FILE")
    args = p.parse_args(argv)
    for name in ("requests", "clients"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    print(f"on {describe()}")
    write_report(args.json, {"cpu": cpu_info(), "command": f"python -m labkit.benchmarks.soak --requests "
                             f"{args.requests} --clients {args.clients}",
                             "results": run(requests=args.requests, clients=args.clients)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
