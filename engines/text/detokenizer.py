"""Incremental detokenization with stop strings. Pure: no torch, no I/O.

Decoding the whole output at every token costs time quadratic in its length, on
the event loop. `StreamDecoder` re-decodes only a short window instead: the ids
from `prefix` to the end, and the ids from `prefix` to `read`, whose text was
already sent. The difference is the new text. Decoding with the window's first
tokens as context, rather than the new ids alone, keeps the result equal to a
full decode: a tokenizer that treats the first token of a sequence specially
(dropping a leading space, say) does so in both decodes, and it cancels out.

Two things are held back:

- a trailing U+FFFD, which means a multi-byte character is still incomplete; the
  window then keeps growing until a later token completes it;
- a suffix that could be the start of a stop string (`StopMatcher`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engines.text.stop_strings import StopMatcher

REPLACEMENT = "\ufffd"

Decode = Callable[[Sequence[int]], str]


@dataclass(slots=True)
class StepResult:
    text: str  # newly emitted text
    stopped: bool  # a stop string matched; generation must end


@dataclass(slots=True)
class StreamDecoder:
    """Turns ids into text as they arrive, decoding O(1) ids per new id."""

    decode: Decode
    ids: list[int] = field(default_factory=list)
    prefix: int = 0  # first id of the decode window
    read: int = 0  # ids before this one have been turned into text
    prefix_chars: int = 0  # len(decode(ids[prefix:read]))
    held_chars: int = 0  # text after ids[read] already sent while its last character was incomplete

    def push(self, new_ids: Sequence[int], *, last: bool = False) -> str:
        """Add ids; return the new text that is complete (all of it with `last=True`)."""
        self.ids.extend(new_ids)
        if not new_ids and not last:
            return ""
        text = self.decode(self.ids[self.prefix :])
        start = self.prefix_chars + self.held_chars
        if not last and text.endswith(REPLACEMENT):
            stable = text[start : len(text.rstrip(REPLACEMENT))]
            self.held_chars += len(stable)
            return stable
        self.prefix, self.read = self.read, len(self.ids)
        self.prefix_chars = len(self.decode(self.ids[self.prefix : self.read]))
        self.held_chars = 0
        return text[start:]


@dataclass(slots=True)
class IncrementalDetokenizer:
    decode: Decode
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    _decoder: StreamDecoder = field(init=False)
    _stops: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self._decoder = StreamDecoder(self.decode)
        self._stops = StopMatcher(self.stop, self.include_stop_str)

    def step(self, new_ids: Sequence[int], *, last: bool = False) -> StepResult:
        """Add generated ids; return the text that is now safe to send.

        With `last=True` everything still held back is flushed (minus any stop string).
        """
        if self._stops.stopped:
            return StepResult("", True)
        text = self._decoder.push(new_ids, last=last)
        if not text and not last:
            return StepResult("", False)
        out = self._stops.feed(text, last=last)
        return StepResult(out.text, out.stopped)

