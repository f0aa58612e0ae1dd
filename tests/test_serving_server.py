"""`labkit serve`: OpenAI chat completions on 127.0.0.1, plain and streamed, errors as JSON 4xx, a clean stop."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import labkit
from labkit.serving.server import Server

MODEL = "shakespeare"


@pytest.fixture(scope="module")
def server():
    model, tok = labkit.load(MODEL)
    with Server(model, tok, MODEL, policy="chunked", max_batch=4, token_budget=64, num_blocks=64) as srv:
        yield srv
    assert not srv.engine.thread.is_alive(), "the engine thread did not stop"


def post(url, body, raw=False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type"), err.read().decode()


def chat(content, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 12, **extra}


def test_a_chat_request_gets_a_completion_equal_to_plain_generation(server):
    status, ctype, body = post(server.url, chat("ROMEO:"))
    assert status == 200 and ctype == "application/json"
    reply = json.loads(body)
    assert reply["object"] == "chat.completion" and reply["model"] == MODEL
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("length", "stop")
    want = labkit.generate(*labkit.load(MODEL), "ROMEO:", max_new_tokens=12)  # no chat template: plain text
    assert choice["message"]["content"] == want.text
    assert reply["usage"]["completion_tokens"] == len(want.token_ids)


def test_a_streamed_request_sends_events_that_add_up_to_the_same_text(server):
    status, ctype, body = post(server.url, chat("ROMEO:", stream=True))
    assert status == 200 and ctype == "text/event-stream"
    events = [line[len("data: "):] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    _, _, plain = post(server.url, chat("ROMEO:"))
    assert text == json.loads(plain)["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_concurrent_requests_are_batched_and_each_gets_its_own_reply(server):
    prompts = ["ROMEO:", "JULIET:", "KING:", "First Citizen:", "HAMLET:", "QUEEN:"]
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda p: json.loads(post(server.url, chat(p))[2]), prompts))
    model, tok = labkit.load(MODEL)
    for p, r in zip(prompts, replies):
        assert r["choices"][0]["message"]["content"] == labkit.generate(model, tok, p, max_new_tokens=12).text
    assert max(len(s.rows) for s in server.engine.engine.steps) > 1, "no step ever ran two requests together"


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(), 404, "does not exist"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), 400, "messages"),
    (json.dumps(chat("x", max_tokens=0)).encode(), 400, "max_tokens"),
    (json.dumps(chat("x", temperature=-1)).encode(), 400, "temperature"),
    (json.dumps(chat("x", max_tokens=10_000)).encode(), 400, "context"),
])
def test_bad_requests_get_a_json_error(server, body, status, fragment):
    got, ctype, text = post(server.url, body, raw=True)
    assert got == status and ctype == "application/json"
    error = json.loads(text)["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_models_health_and_unknown_routes(server):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == MODEL
    with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
        assert json.loads(resp.read())["status"] == "ok"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.url + "/nope", timeout=10)
    assert err.value.code == 404


def test_the_server_binds_this_machine_only():
    model, tok = labkit.load(MODEL)
    with pytest.raises(ValueError, match="host must be 127.0.0.1"):
        Server(model, tok, MODEL, host="0.0.0.0")


def test_labkit_serve_starts_answers_and_stops_on_ctrl_c():
    import signal
    import subprocess
    import sys

    from tests.conftest import python_env

    proc = subprocess.Popen([sys.executable, "-m", "labkit", "serve", "--model", MODEL, "--port", "0", "--max-batch", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"Serving {MODEL}") and "http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.rsplit(" at ", 1)[1].strip()
        status, _, body = post(url, chat("ROMEO:"))
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped" in out
