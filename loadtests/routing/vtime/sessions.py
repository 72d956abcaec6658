"""What a virtual-time workload hands the fleet: sessions of turns.

A :class:`Session` starts at `start_s` and yields its turns one at a time. The
fleet sends a turn when it is due, and once it finished (its output token ids
known) asks the session for the next one, which arrives `delay_s` later. A
multi-turn chat or an agent loop is therefore closed-loop, as a real client is
(the next prompt carries the previous answer), while an open-loop workload is
one turn per session. Outputs are the sim's seeded tokens, so every policy sees
the same prompts; only their timing differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Turn:
    prompt: Sequence[int]  # token ids, as the gateway would send them
    max_tokens: int
    delay_s: float = 0.0  # after the previous turn finished (the first turn: after the session's start)
    group: str = ""  # the prefix group it belongs to, for per-group reports (hot spots)


# A session's next turn given the previous turn's output token ids (None for the first); None ends it.
NextTurn = Callable[[Sequence[int] | None], Turn | None]


@dataclass(frozen=True, slots=True)
class Session:
    key: str  # unique: its turns' request ids are key/0, key/1, ...
    start_s: float
    next_turn: NextTurn
    session_key: str = ""  # the `session` policy's key (a conversation, a user, an agent); "": `key`
    cache_salt: str | None = None  # its tenant's prefix-cache namespace (engine and router); None: shared

    @property
    def routing_key(self) -> str:
        return self.session_key or self.key


def turns_of(turns: Sequence[Turn]) -> NextTurn:
    """A session whose prompts do not depend on its outputs (open loop, or a trace)."""
    it: Iterator[Turn] = iter(turns)

    def next_turn(_previous: Sequence[int] | None) -> Turn | None:
        return next(it, None)
    return next_turn
