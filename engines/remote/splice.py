"""A worker's plain chunks relayed without decoding them in full (pure, no I/O).

Most events of a worker's stream differ from one another only in one choice's text and token ids:
``{"id":"cmpl-1",...,"choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,
"token_ids":[279]}]}``. `PlainTemplate.learn(payload, chunk)` takes such an event that was
decoded in full and found plain (one choice, index 0, text, no logprobs, no finish, no usage,
no parser output) and keeps its bytes before the text, between the text and the ids, and after
the ids. `match(payload)` then reads an event that has exactly those bytes around a string body
and an id list: it returns the text as JSON-escaped bytes, exactly as orjson writes that string,
and the token ids, without decoding the event. Such an event decodes to the learned one with
only the text and the ids changed, so it means the same to `StreamAssembler`. Anything else
(another shape, a string that is not canonical JSON, malformed bytes) is None: the caller decodes
it in full, and malformed bytes fail there as they always did.

A template belongs to one stream: its bytes hold that stream's id and model. `SplicedBatch` puts
the two together for `RemoteEngine`: the Deltas of one read, plain text kept as JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from engines.base import Delta
from engines.remote.stream import StreamAssembler, coalesce, plain

# A string body that may be copied as it is: no quote, backslash or control character.
_NEEDS_LOOK = re.compile(rb'[\x00-\x1f"\\]')
# Token ids as a worker writes them: no sign, no leading zero, at most 19 digits (within 64 bits).
_IDS = re.compile(rb"(?:0|[1-9][0-9]{0,18})(?:, ?(?:0|[1-9][0-9]{0,18}))*")
# The keys whose values change from chunk to chunk (JSON allows white space around the colon).
_TEXT_KEYS = {True: re.compile(rb'"content"\s*:\s*'), False: re.compile(rb'"text"\s*:\s*')}
_IDS_KEY = re.compile(rb'"token_ids"\s*:\s*')


def json_body(text: str) -> bytes:
    """`text` as a JSON string body (without the quotes), as orjson writes it."""
    return orjson.dumps(text)[1:-1]


def canonical_body(raw: bytes) -> bytes | None:
    """`raw` (a worker's string body) as orjson would write the string it means, or None if it is
    not a JSON string body. Bodies without escapes are returned as they are."""
    if _NEEDS_LOOK.search(raw) is None:
        if raw.isascii():
            return raw
        try:
            raw.decode()
        except UnicodeDecodeError:
            return None
        return raw
    try:  # escapes (\n, \u00e9, \"): decode this string alone and write it back
        text = orjson.loads(b'"' + raw + b'"')
    except orjson.JSONDecodeError:
        return None
    return json_body(text) if isinstance(text, str) else None


def _value_at(payload: bytes, key: re.Pattern[bytes], opening: bytes) -> int | None:
    """Where the value of `key` starts, after its `opening` byte, if the key is written exactly once
    (a key written twice could be read either way) and its value opens with `opening`."""
    found = key.findall(payload)
    if len(found) != 1:
        return None
    at = payload.index(found[0]) + len(found[0])
    return at + 1 if payload[at:at + 1] == opening else None


def _string_end(payload: bytes, start: int) -> int:
    """The index of the quote that closes the JSON string whose body starts at `start`, or -1."""
    at = payload.find(b'"', start)
    while at >= 0:
        before = at
        while before > start and payload[before - 1] == 0x5C:  # backslashes: an odd run escapes it
            before -= 1
        if (at - before) % 2 == 0:
            return at
        at = payload.find(b'"', at + 1)
    return -1


def _id_list(raw: bytes) -> list[int]:
    return [int(x) for x in raw.split(b",")] if raw else []


def _plain_text(chunk: Any, chat: bool) -> tuple[str, list[int] | None] | None:
    """(text, token ids or None) of a decoded chunk that is plain, else None."""
    if not isinstance(chunk, dict) or "error" in chunk or chunk.get("usage") is not None:
        return None
    choices = chunk.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    if choice.get("index", 0) != 0 or choice.get("finish_reason") or choice.get("logprobs") is not None:
        return None
    if chat:
        delta = choice.get("delta")
        if not isinstance(delta, dict) or any(v is not None for k, v in delta.items() if k not in ("role", "content")):
            return None
        text = delta.get("content")
    else:
        text = choice.get("text")
    ids = choice.get("token_ids")
    if not isinstance(text, str) or not (ids is None or (isinstance(ids, list)
                                                         and all(type(t) is int and t >= 0 for t in ids))):
        return None
    return text, ids


class PlainTemplate:
    """One stream's plain-chunk layout; empty until `learn` succeeds."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.prefix = b""  # up to and with the text's opening quote
        self.middle = b""  # from the text's closing quote: to the end, or to the ids' "["
        self.suffix: bytes | None = None  # from the ids' "]" to the end; None: the chunks carry no ids
        self.ready = False

    def learn(self, payload: bytes, chunk: Any) -> bool:
        """Take the layout of `payload` (decoded: `chunk`) if the chunk is plain; True if taken."""
        plain = _plain_text(chunk, self.chat)
        if plain is None:
            return False
        text, ids = plain
        start = _value_at(payload, _TEXT_KEYS[self.chat], b'"')
        end = _string_end(payload, start) if start is not None else -1
        if start is None or end < 0 or canonical_body(payload[start:end]) != json_body(text):
            return False
        if ids is None:
            self.prefix, self.middle, self.suffix = payload[:start], payload[end:], None
        else:
            ids_start = _value_at(payload, _IDS_KEY, b"[")
            ids_end = payload.find(b"]", ids_start) if ids_start is not None else -1
            if ids_start is None or ids_start < end or ids_end < 0:
                return False  # no ids, or before the text: not a layout this reads
            raw_ids = payload[ids_start:ids_end]
            if (raw_ids and _IDS.fullmatch(raw_ids) is None) or _id_list(raw_ids) != ids:
                return False
            self.prefix, self.middle, self.suffix = payload[:start], payload[end:ids_start], payload[ids_end:]
        self.ready = True
        return True

    def match(self, payload: bytes) -> tuple[bytes, list[int] | None] | None:
        """(text as a canonical JSON string body, its token ids or None if the chunk has none) of a plain
        chunk in the learned layout, else None."""
        prefix, middle, suffix = self.prefix, self.middle, self.suffix
        if not self.ready or not payload.startswith(prefix):
            return None
        if suffix is None:
            stop = len(payload) - len(middle)
            if stop < len(prefix) or not payload.endswith(middle):
                return None
            raw, ids = payload[len(prefix):stop], None
        else:
            stop = len(payload) - len(suffix)
            if not payload.endswith(suffix):
                return None
            bracket = payload.rfind(b"[", len(prefix), stop)  # `middle` ends with the ids' "["
            at = bracket + 1 - len(middle)
            if bracket < 0 or at < len(prefix) or not payload.startswith(middle, at):
                return None
            written = payload[bracket + 1:stop]
            if not written:
                ids = None
            elif written.isdigit() and len(written) < 20 and (written[0] != 48 or len(written) == 1):  # 48: "0"
                ids = [int(written)]
            elif _IDS.fullmatch(written) is not None:
                ids = _id_list(written)
            else:
                return None
            raw = payload[len(prefix):at]
        body = canonical_body(raw)
        if body is None:
            return None
        return body, ids


@dataclass(slots=True)
class RelayCounts:
    """A worker's events read so far, by how: through a template, or decoded in full."""

    spliced: int = 0
    decoded: int = 0

    def add(self, batch: SplicedBatch) -> None:
        self.spliced += batch.spliced
        self.decoded += batch.decoded
        batch.spliced = batch.decoded = 0


class SplicedBatch:
    """The Deltas of one read from the worker, with plain events kept as JSON.

    `feed(payload)` takes each event of the read in order; `take()` returns its Deltas. Runs of
    plain text (spliced events, and decoded ones without logprobs) become one Delta whose
    `text_json` holds their texts; every other Delta is what the full path makes of it
    (`coalesce` included), so a client sees the same events either way."""

    def __init__(self, assembler: StreamAssembler) -> None:
        self.assembler = assembler
        self.template = PlainTemplate(chat=assembler.chat)
        self.spliced = 0  # events read through the template
        self.decoded = 0  # events decoded in full
        self._run: list[bytes] = []
        self._run_ids: list[int] = []  # the run's token ids, as the worker sent them
        self._run_tokens = 0  # the cumulative count at the run's last event
        self._pending: list[Delta] = []
        self._out: list[Delta] = []

    def feed(self, payload: bytes) -> None:
        """One event's payload; ValueError if it is not JSON (the stream then fails as before)."""
        a = self.assembler
        if a.done:
            return  # as StreamAssembler.feed: nothing counts after the final Delta
        hit = self.template.match(payload)
        if hit is not None:
            self.spliced += 1
            body, ids = hit
            tokens = len(ids) if ids is not None else int(bool(body))
            if tokens:
                self._flush_pending()
                a.completion_tokens += tokens
                self._run.append(body)
                if ids is not None:
                    self._run_ids.extend(ids)
                self._run_tokens = a.completion_tokens
            return
        self.decoded += 1
        chunk = orjson.loads(payload)
        for d in a.feed(chunk):
            if d.logprobs is None and plain(d):
                self._flush_pending()
                self._run.append(json_body(d.text))
                self._run_ids.extend(d.token_ids)
                self._run_tokens = d.completion_tokens
            else:
                self._flush_run()
                self._pending.append(d)
        if not a.done:
            self.template.learn(payload, chunk)

    def take(self) -> list[Delta]:
        self._flush_run()
        self._flush_pending()
        out, self._out = self._out, []
        return out

    def _flush_run(self) -> None:
        if self._run:
            self._out.append(Delta(text_json=b"".join(self._run), token_ids=self._run_ids,
                                   completion_tokens=self._run_tokens))
            self._run = []
            self._run_ids = []

    def _flush_pending(self) -> None:
        if self._pending:
            self._out.extend(coalesce(self._pending))
            self._pending.clear()
