"""Incremental detokenization with stop strings. Pure: no torch, no I/O.

Decoding the whole output at every token costs time quadratic in its length, on
the event loop. `StreamDecoder` re-decodes only a short window instead: the ids
from `prefix` to the end, and the ids from `prefix` to `read`, whose text was
already sent. The difference is the new text. Decoding with the window's first
tokens as context, rather than the new ids alone, keeps the result equal to a
full decode: a tokenizer that treats the first token of a sequence specially
(dropping a leading space, say) does so in both decodes, and it cancels out.

An engine decodes an answer in the context of its prompt's last tokens, as vLLM does
(`prompt_context`): the first token's text is then what it is after the prompt (a
SentencePiece leading space kept), and an answer resumed after some of its tokens
(gateway.llm.migration) goes on exactly where the text left off.

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


def prompt_context(decode: Decode, prompt_ids: Sequence[int]) -> list[int]:
    """The prompt's last tokens an answer is decoded after: the shortest suffix of 4 to 23 tokens whose
    text has no incomplete character (vLLM's choice), else the last 4."""
    for n in range(4, min(len(prompt_ids), 23) + 1):
        suffix = list(prompt_ids[-n:])
        if REPLACEMENT not in decode(suffix):
            return suffix
    return list(prompt_ids[-4:])


def decode_after(decode: Decode, context: Sequence[int], ids: Sequence[int]) -> str:
    """The text of `ids` after `context` (see `prompt_context`); an empty context decodes `ids` alone."""
    if not context:
        return decode(ids)
    base = decode(context)
    full = decode([*context, *ids])
    return full[len(base):] if full.startswith(base) else decode(ids)


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

    def prime(self, context: Sequence[int]) -> None:
        """Decode what follows `context` (the prompt's last tokens) as it reads after them."""
        self.ids = list(context)
        self.prefix, self.read = 0, len(self.ids)
        self.prefix_chars = len(self.decode(self.ids)) if self.ids else 0

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
    context: Sequence[int] = ()  # the prompt's last tokens (`prompt_context`): the text reads on after them
    _decoder: StreamDecoder = field(init=False)
    _stops: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self._decoder = StreamDecoder(self.decode)
        if self.context:
            self._decoder.prime(self.context)
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

