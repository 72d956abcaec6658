"""HTTP limits on a real `sluice serve`: inflated size, content encodings, JSON depth, slow
headers and bodies, and the in-flight bound. Each refusal comes in the route's protocol and the
server keeps serving."""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import time
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.servers import DEFAULT_REPO, LLM_NAME, Server, llm_only_repository, metric_value, start_server

pytestmark = pytest.mark.integration

LIMIT = 64 * 1024
CHAT = {"model": LLM_NAME, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 6, "temperature": 0}


KEEP_ALIVE_S = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("limits")
    repo = llm_only_repository(tmp)
    shutil.copytree(DEFAULT_REPO / "digits_onnx", repo / "digits_onnx")
    srv = start_server(["--model-repository", str(repo), "--max-body-bytes", str(LIMIT), "--header-timeout-s", "1",
                        "--body-timeout-s", "1", "--max-inflight-requests", "2",
                        "--keep-alive-timeout-s", str(KEEP_ALIVE_S)], tmp / "server.log")
    yield srv
    srv.stop()


def _post(server: Server, path: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, content=body, timeout=60,
                      headers={"content-type": "application/json", **headers})


def _still_serves(server: Server) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]


def test_compressed_bodies_are_inflated_and_bounded(server: Server) -> None:
    ok = _post(server, "/v1/chat/completions", gzip.compress(json.dumps(CHAT).encode()), **{"content-encoding": "gzip"})
    assert ok.status_code == 200 and "Paris" in ok.json()["choices"][0]["message"]["content"]
    deflated = _post(server, "/v1/chat/completions", zlib.compress(json.dumps(CHAT).encode()),
                     **{"content-encoding": "deflate"})
    assert deflated.status_code == 200
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of spaces, about 64 KiB on the wire
    assert len(bomb) < LIMIT
    r = _post(server, "/v1/chat/completions", bomb, **{"content-encoding": "gzip"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = _post(server, "/v2/models/digits_onnx/infer", bomb, **{"content-encoding": "gzip"})
    assert r.status_code == 413 and "decompressed" in r.json()["error"]
    assert _post(server, "/v1/chat/completions", b"\x1f\x8bnot gzip", **{"content-encoding": "gzip"}).status_code == 400
    assert _post(server, "/v1/chat/completions", b"{}", **{"content-encoding": "br"}).status_code == 400
    _still_serves(server)


def test_kserve_client_compression_still_works(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    inp = httpclient.InferInput("input", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32), binary_data=False)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("digits_onnx", [inp], request_compression_algorithm=algorithm)
        assert result.as_numpy("label").shape == (1, 1)


def test_json_nested_too_deep_is_400(server: Server) -> None:
    deep: object = "x"
    for _ in range(100):
        deep = [deep]
    r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {"a": deep}})
    assert r.status_code == 400 and "deeper than" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v2/models/digits_onnx/infer", json={"inputs": deep})
    assert r.status_code == 400 and "deeper than" in r.json()["error"]
    brackets_in_strings = {**CHAT, "messages": [{"role": "user", "content": "[{" * 300}]}  # strings do not nest
    assert httpx.post(server.url + "/v1/chat/completions", json=brackets_in_strings, timeout=60).status_code == 200


def test_slow_headers_are_cut_off(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + 60  # the limit is 1 s: this only bounds a connection that is never cut
        closed = False
        while time.monotonic() < deadline:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                closed = True
                break
            s.settimeout(0.5)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:  # reset: the server closed with our headers still unread in its buffer
                closed = True
                break
        assert closed, "a client trickling headers kept its connection"
    _still_serves(server)


def _answered(s: socket.socket) -> bytes:
    """One GET /v1/models on the kept-alive socket `s`: its status line."""
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
        chunk = s.recv(65536)
        assert chunk, f"closed before the answer was whole: {reply[:200]!r}"
        reply += chunk
    return reply.split(b"\r\n", 1)[0]


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _closes(server: Server, reason: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return metric_value(text, "sluice_http_connections_closed_total", {"reason": reason}) or 0.0


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(60)  # the bounds here are seconds: this only ends a connection that is never closed
    try:
        return s.recv(1) == b""
    except OSError:  # reset: closed with our bytes unread
        return True


def test_a_kept_alive_connection_outlives_the_header_timeout_and_the_next_heads_are_timed(server: Server) -> None:
    """Idle between requests a connection has the keep-alive timeout (6 s here), not the header
    timeout (1 s): a client whose own idle expiry is shorter never reuses one the server is closing.
    The next request's headers have the header timeout from their first byte."""
    kept, timed = _closes(server, "keep_alive"), _closes(server, "header_timeout")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as idle, \
            socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as trickle:
        assert _answered(idle) == _answered(trickle) == b"HTTP/1.1 200 OK"
        time.sleep(2)  # idle past the header timeout, well within the keep-alive one
        assert _answered(idle) == _answered(trickle) == b"HTTP/1.1 200 OK"  # the same connections serve
        trickle.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        assert _closed_by_server(trickle) and _closed_by_server(idle)
    assert _closes(server, "header_timeout") == timed + 1
    assert _closes(server, "keep_alive") == kept + 1


def test_slow_body_gets_a_clear_error(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"model\":")
        reply = b""
        while b"did not arrive" not in reply:  # head and body may come in separate segments
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert b" 400 " in reply.split(b"\r\n")[0] and b"did not arrive" in reply


def test_in_flight_bound_answers_503_in_protocol(server: Server) -> None:
    body = {**CHAT, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=120) as a, httpx.Client(base_url=server.url, timeout=120) as b, \
            a.stream("POST", "/v1/chat/completions", json=body) as first, \
            b.stream("POST", "/v1/chat/completions", json=body) as second:
        assert first.status_code == second.status_code == 200
        r = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy" and r.headers["retry-after"]
        r = httpx.get(server.url + "/v2/models/digits_onnx")
        assert r.status_code == 503 and isinstance(r.json()["error"], str)
    _still_serves(server)
