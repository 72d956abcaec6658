"""engines.remote.http1 against a real loopback socket server that writes raw HTTP/1.1 bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from engines.remote.http1 import Pool, ProtocolError, header_lines
from engines.remote.sse import SseLines
from engines.remote.wire import HIGH_WATER, MAX_HEAD_BYTES

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEAD = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


async def _server(handler: Handler) -> AsyncIterator[tuple[Pool, list[int]]]:
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool("127.0.0.1", port, max_connections=4)
    try:
        yield pool, connections
    finally:
        pool.close()
        server.close()


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def _body(pool: Pool, timeout_s: float = 5.0) -> tuple[int, bytes]:
    ex = await pool.exchange(HEAD, b"{}", timeout_s)
    try:
        return ex.status, await ex.read_all(1 << 20)
    finally:
        ex.close()


async def test_chunked_bodies_split_anywhere_are_reassembled_and_the_connection_is_reused() -> None:
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(b"data: a\n\n", b"data: bc\n\n")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            for i in range(len(raw)):  # one byte per write: every split point
                writer.write(raw[i:i + 1])
                await writer.drain()

    async for pool, conns in _server(handler):
        for _ in range(3):
            status, body = await _body(pool)
            assert (status, body) == (200, b"data: a\n\ndata: bc\n\n")
        assert len(conns) == 1  # keep-alive: one connection for three requests


async def test_whole_chunks_in_one_read_are_taken_at_once_and_a_bad_one_is_refused() -> None:
    bodies = iter([_chunked(b"data: a\n\n", b"data: bc\n\n", b"x" * 300),
                   b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",  # a chunk extension is ignored
                   b"3\r\nabc\r\n2\r\ndeXY0\r\n\r\n"])  # no CRLF after a whole chunk's data

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)  # the head read first: the body comes in a read of its own
            writer.write(next(bodies))
            await writer.drain()

    async for pool, _ in _server(handler):
        assert await _body(pool) == (200, b"data: a\n\ndata: bc\n\n" + b"x" * 300)
        assert await _body(pool) == (200, b"abcde")
        with pytest.raises(ProtocolError):
            await _body(pool)


async def test_rest_leaves_the_socket_unread_and_the_next_read_takes_all() -> None:
    more = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await more.wait()
        for piece in (b"b", b"c", b"d"):
            writer.write(b"1\r\n%s\r\n" % piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    async for pool, _ in _server(handler):
        ex = await pool.exchange(HEAD, b"{}", 5.0)
        assert await ex.read() == b"a"
        resting = asyncio.ensure_future(ex.rest(0.5))
        more.set()
        await asyncio.sleep(0.3)  # the worker has written; the held socket was not read
        assert ex._conn.take() == b""  # nothing reached the protocol while held
        await resting
        assert await ex.read_all(1 << 20) == b"bcd"
        ex.close()


async def test_content_length_and_eof_bodies() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope!")
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nuntil-eof")
        await writer.drain()

    async for pool, conns in _server(handler):
        assert await _body(pool) == (404, b"nope!")
        assert await _body(pool) == (200, b"until-eof")
        assert len(conns) == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()  # then close: the pooled connection is dead

    async for pool, conns in _server(handler):
        assert await _body(pool) == (200, b"ok")
        await asyncio.sleep(0.05)
        assert await _body(pool) == (200, b"ok")
        assert len(conns) == 2


async def test_malformed_responses_and_early_close_raise() -> None:
    replies = iter([b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"])

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(next(replies))
        await writer.drain()

    async for pool, _ in _server(handler):
        with pytest.raises(ProtocolError):
            await _body(pool)
        with pytest.raises(ProtocolError):
            await _body(pool)
        with pytest.raises(ConnectionError):
            await _body(pool)


async def test_a_silent_body_times_out_and_abort_ends_a_read() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async for pool, _ in _server(handler):
        ex = await pool.exchange(HEAD, b"{}", 5.0)
        assert await ex.read() == b"abc"
        ex.idle_timeout_s = 0.2
        with pytest.raises(TimeoutError):
            await ex.read()
        ex.close()
        ex = await pool.exchange(HEAD, b"{}", 5.0)
        assert await ex.read() == b"abc"
        reading = asyncio.ensure_future(ex.read())
        await asyncio.sleep(0.05)
        ex.abort()
        with pytest.raises(ConnectionError):
            await reading
        ex.close()


def test_sse_lines_keep_a_cut_line_and_skip_comments() -> None:
    lines = SseLines(max_line_bytes=64)
    assert lines.feed(b": ping\n\ndata: {\"a\"") == []
    assert lines.feed(b":1}\n\ndata: [DONE]\n\n") == [b'{"a":1}', b"[DONE]"]
    with pytest.raises(ValueError):
        lines.feed(b"data: " + b"x" * 100)


def test_sse_lines_bound_a_line_that_arrives_in_pieces_or_whole() -> None:
    lines = SseLines(max_line_bytes=64)
    assert lines.feed(b"data: " + b"x" * 30) == []
    assert lines.feed(b"x" * 20) == []
    assert lines.feed(b"x\ndata: y\n") == [b"x" * 51, b"y"]
    with pytest.raises(ValueError):
        for _ in range(10):
            lines.feed(b"z" * 10)  # no newline yet: the unfinished line passes the bound
    with pytest.raises(ValueError):
        SseLines(max_line_bytes=64).feed(b"data: " + b"x" * 100 + b"\ndata: y\n")


async def test_a_response_head_over_the_bound_is_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(MAX_HEAD_BYTES // 16 + 10):  # many short header lines, each under the line bound
            writer.write(b"X-H%08d: v\r\n" % i)
        await writer.drain()
        await asyncio.sleep(5)

    async for pool, _ in _server(handler):
        with pytest.raises(ProtocolError):
            await _body(pool)


async def test_bad_framing_numbers_are_refused() -> None:
    replies = iter([b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n"])

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(next(replies))
        await writer.drain()
        await asyncio.sleep(5)

    async for pool, _ in _server(handler):
        for _ in range(3):
            with pytest.raises(ProtocolError):
                await _body(pool)


async def test_an_unread_body_stops_the_socket_being_read() -> None:
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        for _ in range(256):  # 16 MiB the client never reads
            writer.write(piece)
            if writer.transport.get_write_buffer_size() > 4 * HIGH_WATER:
                sent.set()  # the client stopped reading: our buffer fills instead of its memory
                await asyncio.sleep(30)
        await writer.drain()

    async for pool, _ in _server(handler):
        ex = await pool.exchange(HEAD, b"{}", 5.0)
        await asyncio.wait_for(sent.wait(), 10)
        unread = len(await ex.read())
        assert HIGH_WATER < unread < HIGH_WATER + (1 << 20)  # a read or two past the mark, not 16 MiB
        ex.close()


async def test_the_pool_opens_at_most_max_connections() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await asyncio.sleep(30)  # never ends: each exchange holds its connection

    async for pool, conns in _server(handler):  # max_connections=4
        held = [await pool.exchange(HEAD, b"{}", 5.0) for _ in range(4)]
        fifth = asyncio.ensure_future(pool.exchange(HEAD, b"{}", 5.0))
        await asyncio.sleep(0.2)
        assert not fifth.done() and len(conns) == 4
        held[0].close()  # not read to its end: closed, and its slot freed
        ex = await asyncio.wait_for(fifth, 5)
        assert len(conns) == 5
        for e in [*held, ex]:
            e.close()


def test_header_lines_refuse_what_could_split_the_head() -> None:
    assert header_lines({"traceparent": "00-ab-cd-01", "X-Request-Id": "r1"}) == (
        b"traceparent: 00-ab-cd-01\r\nX-Request-Id: r1\r\n")
    assert header_lines({}) == b""
    for bad in ({"X": "a\r\nHost: evil"}, {"X": "a\nb"}, {"X\r\nY": "1"}, {"X:Y": "1"}, {"": "1"}, {"X": "a\0"}):
        with pytest.raises(ValueError):
            header_lines(bad)
