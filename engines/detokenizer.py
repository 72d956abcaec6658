"""Incremental detokenization with stop strings. Pure: no torch, no I/O.

Text is re-decoded from the generated ids on every step and only the new,
stable part is emitted. Two things are held back:

- a trailing U+FFFD, which means a multi-byte character is still incomplete;
- a suffix that could be the start of a stop string, until it is known not to be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


@dataclass(slots=True)
class StepResult:
    text: str  # newly emitted text
    stopped: bool  # a stop string matched; generation must end


@dataclass(slots=True)
class IncrementalDetokenizer:
    decode: Callable[[Sequence[int]], str]
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    ids: list[int] = field(default_factory=list)
    emitted: int = 0  # characters of the full text already sent
    final_text: str | None = None  # set once a stop string matched

    def step(self, new_ids: Sequence[int], *, last: bool = False) -> StepResult:
        """Add generated ids; return the text that is now safe to send.

        With `last=True` everything still held back is flushed (minus any stop string).
        """
        if self.final_text is not None:
            return StepResult("", True)
        self.ids.extend(new_ids)
        text = self.decode(self.ids)
        cut = self._find_stop(text)
        if cut is not None:
            self.final_text = text[:cut]
            out = self.final_text[self.emitted :]
            self.emitted = len(self.final_text)
            return StepResult(out, True)
        safe = len(text)
        if not last:
            if text.endswith(REPLACEMENT):
                safe = len(text.rstrip(REPLACEMENT))
            safe = min(safe, len(text) - self._partial_stop_len(text))
        out = text[self.emitted : safe] if safe > self.emitted else ""
        self.emitted = max(self.emitted, safe)
        return StepResult(out, False)

    @property
    def text(self) -> str:
        return self.final_text if self.final_text is not None else self.decode(self.ids)

    def _find_stop(self, text: str) -> int | None:
        """Index where output must end if a stop string occurs in the unsent tail."""
        best: int | None = None
        # A match can begin inside already-emitted text only if it was held back,
        # which the partial-stop rule prevents; search from the emitted mark.
        start = max(0, self.emitted - max((len(s) for s in self.stop), default=0))
        for s in self.stop:
            i = text.find(s, start)
            if i != -1:
                end = i + len(s) if self.include_stop_str else i
                best = end if best is None else min(best, end)
        return best

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
