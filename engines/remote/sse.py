"""Server-sent events from a worker's response body (pure, no I/O).

`SseLines.feed(data)` takes body bytes as they arrive and returns the payloads of the complete
``data:`` lines in them, in order; comments (``: ping``) and other fields are skipped, and a
line cut between two reads is kept until its end arrives. OpenAI-compatible servers send one
``data:`` line per event, so each payload is one JSON chunk (or ``[DONE]``).
"""

from __future__ import annotations

MAX_LINE_BYTES = 8 * 1024 * 1024  # a first chunk carries prompt_token_ids: ~7 bytes a token


class SseLines:
    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._rest: list[bytes] = []  # pieces of an unfinished line, joined once it ends
        self._rest_len = 0
        self._max = max_line_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Payloads of the `data:` lines completed by `data`. ValueError for a line over the bound."""
        if b"\n" not in data:  # a long line arriving in pieces: kept, not re-copied at every read
            self._rest.append(data)
            self._rest_len += len(data)
            if self._rest_len > self._max:
                raise ValueError(f"the worker sent an event line over {self._max} bytes")
            return []
        if self._rest:
            self._rest.append(data)
            data = b"".join(self._rest)
            self._rest.clear()
        lines = data.split(b"\n")
        last = lines.pop()
        self._rest_len = len(last)
        if last:
            self._rest.append(last)
        if self._rest_len > self._max or (len(data) > self._max and any(len(ln) > self._max for ln in lines)):
            raise ValueError(f"the worker sent an event line over {self._max} bytes")
        out = []
        for line in lines:
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
        return out
