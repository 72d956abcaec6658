"""Stream chunks as JSON bytes, built from a per-response template.

Every chunk of one streamed response repeats the same envelope (id, object, created, model,
system_fingerprint, and `usage: null` when usage was asked for); only the choices change. The
envelope is serialised once per response, and the common chunk (one choice carrying text and
nothing else) is spliced from fixed pieces around the text, so a relayed token costs one string
encoding instead of building and serialising a dict. Other chunks go through orjson. The bytes
are the same JSON as serialising the equivalent dict.
"""

from __future__ import annotations

from typing import Any

import orjson


class ChunkEncoder:
    def __init__(self, request_id: str, obj: str, created: int, model: str, *, include_usage: bool) -> None:
        envelope = orjson.dumps({"id": request_id, "object": obj, "created": created, "model": model,
                                 "system_fingerprint": None})
        self._head = envelope[:-1] + b',"choices":['
        self._tail = b'],"usage":null}' if include_usage else b"]}"
        self._usage_head = envelope[:-1] + b',"choices":[],"usage":'

    def choices(self, choices: list[dict[str, Any]]) -> bytes:
        """A chunk with these choices (any content)."""
        return self._head + b",".join(orjson.dumps(c) for c in choices) + self._tail

    def text(self, index: int, text: str) -> bytes:
        """A completion chunk: choice `index` adds `text` (no logprobs, not finished)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"text":' + orjson.dumps(text)
                + b',"logprobs":null,"finish_reason":null}' + self._tail)

    def content(self, index: int, content: str) -> bytes:
        """A chat chunk: choice `index` adds `content` (no logprobs, not finished)."""
        return (self._head + b'{"index":' + str(index).encode() + b',"delta":{"content":' + orjson.dumps(content)
                + b'},"logprobs":null,"finish_reason":null}' + self._tail)

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The final chunk of a stream that asked for usage."""
        return self._usage_head + orjson.dumps(usage) + b"}"
