"""Stop strings over streamed text. Pure: no torch, no I/O.

Text arrives in pieces. A stop string ends the output where it begins (or where
it ends, with `include_stop_str`); a suffix that could still grow into a stop
string is held back until the next piece settles it, so a stop string is never
sent and then retracted.

Each piece is scanned together with the held-back suffix only. That suffix is
shorter than the longest stop string, and no match can begin in text already
sent (it would have been held back), so the work per piece is bounded by the
piece's length plus the longest stop string, not by the length of the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class StopResult(NamedTuple):
    text: str  # text that is now safe to send
    stopped: bool  # a stop string matched; nothing more will be sent


@dataclass(slots=True)
class StopMatcher:
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    held: str = ""  # received, not yet sent: it may be the start of a stop string
    stopped: bool = False
    _max_len: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        # An empty stop string would match everywhere; no API gives it a meaning.
        self.stop = tuple(s for s in self.stop if s)
        self._max_len = max((len(s) for s in self.stop), default=0)

    def feed(self, text: str, *, last: bool = False) -> StopResult:
        """Add the next piece of text; with `last=True` release everything held back."""
        if self.stopped:
            return StopResult("", True)
        if not self.stop:
            return StopResult(text, False)
        window = self.held + text
        cut = self._find_stop(window)
        if cut is not None:
            self.stopped, self.held = True, ""
            return StopResult(window[:cut], True)
        keep = 0 if last else self._partial_stop_len(window)
        safe = len(window) - keep
        self.held = window[safe:]
        return StopResult(window[:safe], False)

    def _find_stop(self, window: str) -> int | None:
        """Where the output must end if a stop string occurs in the window."""
        best: int | None = None
        for s in self.stop:
            i = window.find(s)
            if i != -1:
                end = i + len(s) if self.include_stop_str else i
                best = end if best is None else min(best, end)
        return best

    def _partial_stop_len(self, window: str) -> int:
        """Length of the longest suffix of the window that is a proper prefix of a stop string."""
        longest = 0
        tail = window[-(self._max_len - 1) :] if self._max_len > 1 else ""
        for s in self.stop:
            for n in range(min(len(s) - 1, len(tail)), longest, -1):
                if tail.endswith(s[:n]):
                    longest = n
                    break
        return longest
