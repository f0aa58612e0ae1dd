"""`labkit serve` under hostile input and misbehaving clients: every case gets a 4xx or a clean close in bounded time,
an engine failure fails only its own requests, a client that leaves frees its KV blocks, a full queue answers 429.
127.0.0.1 only, bounded in count and time, processes stopped by PID."""
from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import labkit
from labkit.serving.http.server import Server

MODEL = "shakespeare"


@pytest.fixture(scope="module")
def srv():
    model, tok = labkit.load(MODEL)
    with Server(model, tok, MODEL, policy="chunked", max_batch=4, token_budget=64, num_blocks=64, max_waiting=16,
                body_timeout_s=2.0) as server:
        yield server


def raw(server, data: bytes, read_timeout: float = 10.0, half_close: bool = False) -> tuple[str, float]:
    """Send raw bytes; return what came back (b'' if the server closed without a word) and how long it took."""
    host, port = server.url.rsplit("/", 1)[-1].split(":")
    t0 = time.monotonic()
    chunks = []
    with socket.create_connection((host, int(port)), timeout=read_timeout) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                    break
        except OSError:  # a timeout, a reset, a broken pipe
            pass  # the server closed on us (what it said, if anything, is in `chunks`)
    return b"".join(chunks).decode("latin-1"), time.monotonic() - t0


def _complete(resp: bytes) -> bool:
    head, _, body = resp.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def post(path, body: bytes, length=None, extra: bytes = b"") -> bytes:
    length = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n"
            .encode() + extra + b"\r\n" + body)


def status(resp: str) -> int | None:
    return int(resp.split(" ", 2)[1]) if resp.startswith("HTTP/1.1") else None


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("name, data, want", [
    ("deep JSON", post(CHAT, b"[" * 100_000 + b"]" * 100_000), 400),
    ("huge integer", post(CHAT, b'{"max_tokens": ' + b"9" * 5000 + b"}"), 400),
    ("invalid UTF-8", post(CHAT, b'{"messages": "\xff\xfe"}'), 400),
    ("body over the limit", post(CHAT, b"x" * (2 << 20)), 413),
    ("Content-Length abc", post(CHAT, b"{}", length="abc"), 400),
    ("Content-Length -1", post(CHAT, b"{}", length=-1), 400),
])
def test_hostile_bodies_get_a_client_error(srv, name, data, want):
    resp, took = raw(srv, data)
    assert status(resp) == want, f"{name}: {resp[:200]!r}"
    assert took < 10


@pytest.mark.parametrize("body, param", [
    (b'{"model": "shakespeare", "messages": [{"role": "user", "content": "hi \\ud800"}]}', "messages[0].content"),
    (b'{"model": "shakespeare", "messages": [{"role": "user", "content": "ok"}], "stop": ["\\udfff"]}', "stop[0]"),
    (b'{"\\ud800": 1}', None),
])
def test_a_lone_surrogate_escape_is_a_client_error_naming_the_field(srv, body, param):
    resp, _ = raw(srv, post(CHAT, body))
    assert status(resp) == 400, resp[:300]
    error = json.loads(resp.partition("\r\n\r\n")[2])["error"]
    assert error["param"] == param and "surrogate" in error["message"], error


def test_a_body_shorter_than_its_content_length_is_dropped_in_bounded_time(srv):
    resp, took = raw(srv, post(CHAT, b'{"messages": []}', length=1000), read_timeout=15)
    assert status(resp) in (408, None) and took < 8, (resp[:200], took)  # 408, or closed: never held open


def test_a_half_closed_body_cannot_slip_past_the_limit(srv):
    resp, _ = raw(srv, post(CHAT, b"x" * (3 << 19), length=-1), half_close=True)  # 1.5 MB, no usable length
    assert status(resp) in (400, 413, None)


def test_a_slow_body_times_out(srv):
    host, port = srv.url.rsplit("/", 1)[-1].split(":")
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.sendall(post(CHAT, b"", length=100))
        for _ in range(30):  # one byte every 0.2 s: never finishes inside the 2 s body timeout
            try:
                s.sendall(b" ")
            except OSError:
                break
            time.sleep(0.2)
            if time.monotonic() - t0 > 4:
                break
        s.settimeout(5)
        try:
            resp = s.recv(4096).decode("latin-1")
        except (socket.timeout, OSError):
            resp = ""
    assert status(resp) in (408, None), resp[:200]


class FailingOnce:
    """The model, except that its next forward pass raises (a test hook: no production code knows of it)."""

    def __init__(self, model):
        self.model, self.armed = model, True

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise RuntimeError("injected fault")
        return self.model(*args, **kwargs)


def chat_body(content="ROMEO:", **kw) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 6, **kw}).encode()


def http(server, body: bytes, timeout=30):
    req = urllib.request.Request(server.url + CHAT, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), err.headers


def test_an_engine_failure_fails_only_its_pass_and_the_engine_serves_on(srv, caplog):
    engine = srv.engine.engine
    engine.model = FailingOnce(engine.model)
    try:
        with caplog.at_level("ERROR", logger="labkit.serving"):
            code, body, _ = http(srv, chat_body())
        assert code == 500 and "injected fault" in body["error"]["message"]
        assert any("injected fault" in str(r.exc_info[1]) for r in caplog.records if r.exc_info), "no traceback logged"
        code, body, _ = http(srv, chat_body())
        assert code == 200 and body["choices"][0]["message"]["content"]
        with urllib.request.urlopen(srv.url + "/health", timeout=10) as resp:
            assert json.loads(resp.read())["status"] == "ok"
    finally:
        engine.model = engine.model.model if isinstance(engine.model, FailingOnce) else engine.model


def test_a_sampling_failure_fails_that_request_alone(srv):
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(http, srv, chat_body(temperature=1e-40, max_tokens=30))
        good = pool.submit(http, srv, chat_body(max_tokens=30))
        assert bad.result()[0] == 400 and "temperature" in bad.result()[1]["error"]["message"]
        assert good.result()[0] == 200 and good.result()[1]["choices"][0]["finish_reason"] == "length"


def _blocks_free(server) -> bool:
    tables = server.engine.engine.scheduler.blocks
    return tables.n_free == tables.num_blocks and not server.engine.engine.scheduler.running


def test_a_client_that_leaves_mid_stream_frees_its_blocks(srv):
    host, port = srv.url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(post(CHAT, chat_body(max_tokens=400, stream=True)))
        got = b""
        while got.count(b"data: ") < 3:  # the reply is under way
            chunk = s.recv(4096)
            assert chunk, got.decode("latin-1")
            got += chunk
        assert not _blocks_free(srv)
    deadline = time.monotonic() + 5
    while not _blocks_free(srv) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _blocks_free(srv), "the request kept its KV blocks after its client left"


def test_a_client_that_leaves_a_plain_request_cancels_it(srv):
    host, port = srv.url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(post(CHAT, chat_body(max_tokens=400)))
        time.sleep(0.5)
    deadline = time.monotonic() + 5
    while not _blocks_free(srv) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _blocks_free(srv)


def test_a_request_past_its_deadline_ends_with_504_and_frees_its_blocks():
    model, tok = labkit.load(MODEL)
    with Server(model, tok, MODEL, num_blocks=64, request_timeout=0.3) as server:
        code, body, _ = http(server, chat_body(max_tokens=400))
        assert code == 504 and "deadline" in body["error"]["message"]
        assert _blocks_free(server)


def test_a_full_queue_answers_429_with_retry_after_and_load_leaves_the_server_healthy():
    """200 requests at concurrency 32: each answered 200 or 429 (Retry-After), none reset; healthy after."""
    model, tok = labkit.load(MODEL)
    with Server(model, tok, MODEL, max_batch=4, num_blocks=64, max_waiting=8) as server:
        def one(i):
            try:
                code, _, headers = http(server, chat_body(f"ROMEO {i}:", max_tokens=2), timeout=60)
                return code, headers.get("Retry-After")
            except OSError as exc:
                return type(exc).__name__, None

        t0 = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(one, range(200)))
        codes = [c for c, _ in results]
        assert set(codes) <= {200, 429}, {c for c in codes if c not in (200, 429)}
        assert codes.count(200) >= 8 and all(ra and int(ra) >= 1 for c, ra in results if c == 429)
        assert time.monotonic() - t0 < 120
        with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
            assert json.loads(resp.read())["status"] == "ok"
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
        assert f"labkit:num_requests_rejected_total {float(codes.count(429))}" in metrics
        assert _blocks_free(server)


def test_idle_connections_are_closed():
    model, tok = labkit.load(MODEL)
    with Server(model, tok, MODEL, num_blocks=16, idle_timeout_s=1.0) as server:
        host, port = server.url.rsplit("/", 1)[-1].split(":")
        with socket.create_connection((host, int(port)), timeout=15) as s:
            t0 = time.monotonic()
            assert s.recv(1) == b""  # the server hangs up on a silent connection
            assert 0.5 < time.monotonic() - t0 < 8


@pytest.mark.slow
def test_labkit_serve_smollm2_starts_small_answers_and_stops_on_ctrl_c():
    import signal
    import subprocess
    import sys

    from tests.conftest import python_env
    from tests.smollm2_shared import smollm2

    smollm2()  # skips when the GGUF package is missing
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "serve", "--model", "smollm2-135m", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    try:
        line = proc.stdout.readline()
        assert line.startswith("Serving smollm2-135m") and "KV pool of" in line, line + proc.stderr.read()
        rss = int(next(l for l in open(f"/proc/{proc.pid}/status") if l.startswith("VmRSS")).split()[1]) * 1024
        assert rss < 1.5e9, f"RSS at start {rss / 1e9:.2f} GB"
        url = line.rsplit(" at ", 1)[1].strip()
        req = urllib.request.Request(url + CHAT, headers={"Content-Type": "application/json"}, data=json.dumps(
            {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).encode())
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.loads(resp.read())["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)  # stopping joins two threads (up to 10 s each) under load
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"labkit serve did not stop within 60 s of a ctrl-c; it printed {out[-500:]!r}, {err[-2000:]!r}")
    assert proc.returncode == 0, err
    assert "stopped" in out
