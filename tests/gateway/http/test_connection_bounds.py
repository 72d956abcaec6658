"""Connection bounds on a real `sluice serve` over real sockets: header size and count (431 in the
route's protocol, before authentication), requests rather than connections against the in-flight
cap, kept-alive connections bounded per client address and in total, fresh ones (no request yet)
in total only, and a client that stops reading an SSE stream (gateway.http.protocol,
gateway.http.connections, gateway.http.flow)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.servers import LLM_NAME, Server, llm_only_repository, metric_value, start_server

pytestmark = pytest.mark.integration

KEY = "bounds-test-key"
AUTH = f"Authorization: Bearer {KEY}\r\n".encode()
PER_CLIENT = 64
TOTAL = 160
FRESH = 240


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("bounds")
    # Idle sockets must outlive each test here: the header timeout is long. uvicorn's old
    # connection bound would have been 2 × 8 = 16 connections.
    srv = start_server(["--model-repository", str(llm_only_repository(tmp)), "--max-inflight-requests", "8",
                        "--header-timeout-s", "120", "--max-idle-connections-per-client", str(PER_CLIENT),
                        "--max-idle-connections", str(TOTAL), "--max-fresh-connections", str(FRESH),
                        "--stream-write-timeout-s", "2",
                        "--max-stream-buffer-bytes", "4096"], tmp / "server.log", env={"SLUICE_API_KEYS": KEY})
    yield srv
    srv.stop()


def _exchange(server: Server, request: bytes) -> bytes:
    """Send `request` on a raw socket and read the answer to its end."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as s:
        s.sendall(request)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def _status_and_json(reply: bytes) -> tuple[int, object]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def _chat(server: Server, source: str = "127.0.0.1") -> str:
    """A normal chat through the official client, from the loopback address `source`."""
    http = httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=300)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, http_client=http, max_retries=0)
    reply = client.chat.completions.create(model=LLM_NAME, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4)
    http.close()
    return reply.choices[0].message.content or ""


def _metrics(server: Server) -> str:
    return httpx.get(server.url + "/metrics", timeout=30).text


def _open_idle(server: Server, count: int, source: str) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.bind((source, 0))
        s.connect(("127.0.0.1", server.http_port))
        socks.append(s)
    return socks


def _closed(socks: list[socket.socket]) -> set[int]:
    """Indices of the sockets the server has closed (EOF or reset), without waiting."""
    closed = set()
    for i, s in enumerate(socks):
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                closed.add(i)
        except BlockingIOError:
            pass
        except OSError:
            closed.add(i)
    return closed


def _wait_closed(socks: list[socket.socket], count: int) -> set[int]:
    deadline = time.monotonic() + 60  # only bounds a test whose server never closes them
    closed = _closed(socks)
    while len(closed) < count and time.monotonic() < deadline:
        time.sleep(0.2)
        closed = _closed(socks)
    time.sleep(0.5)  # and no more than that
    return _closed(socks)


def _idle_now(server: Server) -> float:
    return metric_value(_metrics(server), "sluice_http_idle_connections") or 0.0


def _close_all(server: Server, *groups: list[socket.socket]) -> None:
    for group in groups:
        for s in group:
            s.close()
    deadline = time.monotonic() + 60
    while _idle_now(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)


def test_too_many_header_bytes_get_431_before_authentication(server: Server) -> None:
    many = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"v" * 90) for i in range(5000))  # 5,000 headers, ~500 KB
    status, body = _status_and_json(_exchange(server, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + many
                                              + b"\r\n"))
    assert status == 431 and body["error"]["code"] == "request_header_fields_too_large"  # type: ignore[index]
    # No key at all: refused for its headers, not its key; on a KServe route in KServe's format.
    status, body = _status_and_json(_exchange(server, b"GET /v2/models/x HTTP/1.1\r\nHost: x\r\n" + many
                                              + b"\r\n"))
    assert status == 431 and "header fields" in body["error"]  # type: ignore[index]
    # One header of 100 KB: bounded by bytes, not count.
    status, body = _status_and_json(_exchange(server, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH
                                              + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n"))
    assert status == 431 and "65536 bytes" in body["error"]["message"]  # type: ignore[index]
    assert metric_value(_metrics(server), "sluice_http_connections_closed_total", {"reason": "header_bytes"})


def test_header_count_is_bounded_at_100(server: Server) -> None:
    def fields(n: int) -> bytes:
        return b"".join(b"X-Field-%d: value-%d\r\n" % (i, i) for i in range(n))

    ok = _exchange(server, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + AUTH + fields(90)
                   + b"\r\n")
    assert _status_and_json(ok)[0] == 200
    status, body = _status_and_json(_exchange(server, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH
                                              + fields(200) + b"\r\n"))
    assert status == 431 and "more than 100 header fields" in body["error"]["message"]  # type: ignore[index]


def test_idle_connections_do_not_take_requests_places(server: Server) -> None:
    # 100 connections that never send a byte, from two addresses (each under its own bound).
    idle = _open_idle(server, 50, "127.0.0.2") + _open_idle(server, 50, "127.0.0.3")
    try:
        assert _chat(server)  # uvicorn's limit_concurrency (2 × 8) would have answered 503
        assert not _closed(idle)
    finally:
        _close_all(server, idle)


def _kept_alive(server: Server, count: int, source: str) -> list[socket.socket]:
    """`count` connections from `source` that each had a request answered and are kept alive. All
    requests are sent before any answer is read: uvicorn closes a kept-alive connection after 5 s."""
    socks = _open_idle(server, count, source)
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    for s in socks:
        _read_response(s, b"")
    return socks


def _evicted(server: Server, reason: str) -> float:
    return metric_value(_metrics(server), "sluice_http_connections_closed_total", {"reason": reason}) or 0.0


def test_kept_alive_connections_per_client_are_bounded(server: Server) -> None:
    before = _evicted(server, "idle_per_client")
    other = _kept_alive(server, 10, "127.0.0.5")
    socks = _kept_alive(server, PER_CLIENT + 26, "127.0.0.4")
    try:
        assert len(_wait_closed(socks, 26)) >= 26
        assert _evicted(server, "idle_per_client") - before == 26  # 127.0.0.4's, not 127.0.0.5's
    finally:
        _close_all(server, socks, other)


def test_kept_alive_connections_in_total_are_bounded(server: Server) -> None:
    before = _evicted(server, "idle_total")
    groups = [_kept_alive(server, 60, f"127.0.0.{i}") for i in (5, 6, 7)]  # 180 > 160, each under 64
    try:
        assert len(_wait_closed(groups[0], 20)) >= 20, "the oldest kept-alive connections overall are closed"
        assert _evicted(server, "idle_total") - before == 20
    finally:
        _close_all(server, *groups)


def test_fresh_connections_are_not_held_to_the_per_client_bound(server: Server) -> None:
    socks = _open_idle(server, 3 * PER_CLIENT, "127.0.0.8")  # a burst of connections yet to send a request
    try:
        time.sleep(1.0)
        assert not _closed(socks)
        for s in socks:
            s.settimeout(60)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert all(_read_response(s, b"")[0] == 200 for s in socks)
    finally:
        _close_all(server, socks)


def test_a_flood_of_fresh_connections_recycles_its_own(server: Server) -> None:
    before = _evicted(server, "fresh_total")
    early = _open_idle(server, 20, "127.0.0.9")
    flood = _open_idle(server, FRESH + 40, "127.0.0.10")  # with the 20: 60 past the total
    try:
        assert _wait_closed(flood, 60) == set(range(60)), "the flood's oldest fresh connections are closed"
        assert _evicted(server, "fresh_total") - before == 61  # the /metrics request's connection: one more
        assert _wait_closed(flood, 61) == set(range(61)) and not _closed(early)
        assert _chat(server, "127.0.0.9")
    finally:
        _close_all(server, early, flood)


def test_client_that_stops_reading_is_cut_and_its_engine_request_aborted(server: Server) -> None:
    # Echo makes the first chunk carry the whole prompt (100 KB of "=", ~1,600 tokens): the stream
    # outgrows a non-reading client's socket (and the stream's small kernel send buffer) at once.
    body = json.dumps({"model": LLM_NAME, "prompt": "=" * 100_000, "echo": True, "max_tokens": 1500,
                       "ignore_eos": True, "stream": True}).encode()
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", server.http_port))
    before = metric_value(_metrics(server), "sluice_stream_slow_reader_total", {"reason": "write_timeout"}) or 0.0
    before += metric_value(_metrics(server), "sluice_stream_slow_reader_total", {"reason": "buffer"}) or 0.0
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH
                 + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    try:
        assert _chat(server)  # served while the slow client holds its stream
        deadline = time.monotonic() + 240  # only bounds a run where the slow client is never cut
        while time.monotonic() < deadline:
            text = _metrics(server)
            cut = sum(metric_value(text, "sluice_stream_slow_reader_total", {"reason": r}) or 0.0
                      for r in ("write_timeout", "buffer"))
            running = metric_value(text, "sluice_engine_requests_running", {"model": LLM_NAME})
            admitted = metric_value(text, "sluice_requests_inflight", {"model": LLM_NAME})
            if cut > before and running == 0 and admitted == 0:
                break
            time.sleep(0.5)
        assert cut > before, "the slow reader was never cut"
        assert running == 0 and admitted == 0, "its engine requests still run, or its slot is still taken"
        received = b""
        slow.settimeout(30)
        try:
            while chunk := slow.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        assert b"[DONE]" not in received  # the connection was closed under it, not finished
    finally:
        slow.close()
    assert _chat(server)


def _read_response(s: socket.socket, buf: bytes) -> tuple[int, bytes]:
    """One response (status, by its content-length) from `s`; returns its status and what followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"connection closed mid-response: {buf!r}"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return int(head.split(b" ", 2)[1]), rest[length:]


@pytest.mark.parametrize("auth", [b"", b"Authorization: Bearer wrong-key\r\n"], ids=["no-key", "wrong-key"])
def test_body_of_a_request_answered_early_is_not_read_as_headers(server: Server, auth: bytes) -> None:
    """A 300 KB body refused (401) before it was read is dropped: not counted as the next request's
    headers (a 431 after the 401), and the same keep-alive connection then serves the next request."""
    before = metric_value(_metrics(server), "sluice_http_connections_closed_total", {"reason": "header_bytes"}) or 0
    body = b'{"model": "%s", "prompt": "%s"}' % (LLM_NAME.encode(), b"a" * 300_000)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status, rest = _read_response(s, b"")
        assert status == 401
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
        status, rest = _read_response(s, rest)
        assert status == 200  # its own answer, not a stale 431
        s.shutdown(socket.SHUT_WR)
        while chunk := s.recv(65536):
            rest += chunk
    assert rest == b""  # exactly one answer each, nothing after
    after = metric_value(_metrics(server), "sluice_http_connections_closed_total", {"reason": "header_bytes"}) or 0
    assert after == before
