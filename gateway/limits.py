"""Bounds on HTTP requests: body size (raw and inflated), content encoding, JSON nesting depth.
(The KServe gRPC server's bounds are `gateway.kserve.grpc.limits`.)

`read_body` drains an ASGI request body once, before the app sees it: every body is
bounded by `max_body_bytes`, a gzip or deflate body is inflated as a stream and the
inflated size is bounded the same way (a compression bomb stops at the limit, not in
memory), and a JSON body may nest at most `MAX_JSON_DEPTH` deep.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from engines.errors import ErrorKind, SluiceError

MAX_JSON_DEPTH = 64  # deeper than any OpenAI or KServe body; a deep one costs recursion to parse
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)  # linear: no nested quantifiers
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BodyTooLarge(SluiceError):
    def __init__(self, limit: int, inflated: bool = False) -> None:
        what = "Request body, decompressed," if inflated else "Request body"
        super().__init__(f"{what} exceeds the limit of {limit} bytes.", ErrorKind.TOO_LARGE)


def json_depth(raw: bytes | memoryview) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings don't count)."""
    stripped = _STRING.sub(b"", bytes(raw))
    if not stripped:
        return 0
    a = np.frombuffer(stripped, dtype=np.uint8)
    step = np.isin(a, _OPEN).astype(np.int32) - np.isin(a, _CLOSE).astype(np.int32)
    return int(np.cumsum(step).max(initial=0))


def check_json_depth(raw: bytes | memoryview) -> None:
    if len(raw) <= MAX_JSON_DEPTH:
        return
    data = raw if isinstance(raw, bytes) else bytes(raw)
    # Nesting needs an opening bracket per level: a text with few of them (every KServe header) is
    # cleared by two C-speed counts, without the scan below.
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return
    if json_depth(data) > MAX_JSON_DEPTH:
        raise SluiceError(f"The request JSON nests deeper than {MAX_JSON_DEPTH} levels.", ErrorKind.INVALID_ARG)


class _Inflater:
    def __init__(self, encoding: str, limit: int) -> None:
        self._z = zlib.decompressobj(_WBITS[encoding])
        self._limit = limit
        self.size = 0

    def feed(self, chunk: bytes) -> bytes:
        try:
            # max_length caps what one call may produce: at most one byte past the limit.
            out = self._z.decompress(chunk, self._limit - self.size + 1)
            if self._z.unconsumed_tail:
                raise BodyTooLarge(self._limit, inflated=True)
        except zlib.error as e:
            raise SluiceError(f"cannot decompress the request body: {e}", ErrorKind.INVALID_ARG) from None
        self.size += len(out)
        if self.size > self._limit:
            raise BodyTooLarge(self._limit, inflated=True)
        return out


async def read_body(receive: Receive, encoding: str, limit: int) -> tuple[bytes, int]:
    """(the body, inflated if it was encoded; its size on the wire), or SluiceError."""
    encoding = encoding.strip().lower()
    if encoding not in ("", "identity") and encoding not in _WBITS:
        raise SluiceError(f"Content-Encoding {encoding[:32]!r} is not supported (use gzip or deflate)",
                          ErrorKind.UNSUPPORTED)
    inflater = _Inflater(encoding, limit) if encoding in _WBITS else None
    parts: list[bytes] = []
    wire = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away mid-body; the app sees an empty body and a disconnect
        chunk = message.get("body", b"")
        wire += len(chunk)
        if wire > limit:
            raise BodyTooLarge(limit)
        parts.append(inflater.feed(chunk) if inflater is not None else chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts), wire

