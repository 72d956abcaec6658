"""One simulated request: its tokens, its progress and its blocks; seeded output tokens. Pure.

Output tokens come from `TokenSampler`, a `random.Random` seeded per request, so a
request's output depends only on its seed and the vocabulary, never on its batch
neighbours or timing. `derive_seed` picks the seed the way an engine's outputs
behave: the request's own `seed` if it has one; for greedy requests (temperature
0) the prompt, since a real engine answers the same prompt the same way; else the
request id.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import xxhash

SimFinishReason = Literal["stop", "length", "abort"]
_SEED_MASK = (1 << 63) - 1


def chain_hash(parent: int | None, tokens: Sequence[int], cache_salt: str | None = None) -> int:
    """This engine's hash of one full block: its tokens and its parent's hash (the salt on the first)."""
    h = xxhash.xxh3_64()
    if parent is None:
        h.update(b"root:" + (cache_salt or "").encode())
    else:
        h.update(parent.to_bytes(8, "big"))
    h.update(array("q", tokens).tobytes())
    return h.intdigest()


def derive_seed(seed: int | None, request_id: str, prompt_token_ids: Sequence[int], *, greedy: bool) -> int:
    if seed is not None:
        return seed & _SEED_MASK
    if greedy:
        return xxhash.xxh3_64_intdigest(array("q", prompt_token_ids).tobytes()) & _SEED_MASK
    return xxhash.xxh3_64_intdigest(request_id.encode()) & _SEED_MASK


class TokenSampler:
    """Draws ordinary tokens uniformly from the vocabulary; EOS with `eos_prob` when allowed."""

    __slots__ = ("_eos_id", "_eos_prob", "_rng", "_special", "_vocab_size")

    def __init__(self, seed: int, vocab_size: int, special_token_ids: frozenset[int] = frozenset(),
                 eos_token_id: int | None = None, eos_prob: float = 0.0) -> None:
        self._rng = random.Random(seed)
        self._vocab_size = vocab_size
        self._special = special_token_ids
        self._eos_id = eos_token_id
        self._eos_prob = eos_prob

    def next_token(self, *, allow_eos: bool) -> int:
        if allow_eos and self._eos_prob > 0 and self._eos_id is not None and self._rng.random() < self._eos_prob:
            return self._eos_id
        while True:  # special ids are a handful out of tens of thousands: this ends at once
            token = self._rng.randrange(self._vocab_size)
            if token not in self._special:
                return token


@dataclass(slots=True)
class SimRequest:
    """A request inside the engine. Mutated by the scheduler only."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    sampler: TokenSampler
    arrival_s: float
    ready_s: float  # when the scheduler may first see it (arrival + the cost model's request latency)
    ignore_eos: bool = False
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is computed (or was found cached). Preemption resets it to 0.
    num_computed_tokens: int = 0
    # Leading blocks of `block_ids` already registered in the cache (hit or committed).
    num_committed_blocks: int = 0
    block_ids: list[int] = field(default_factory=list)
    # Chained hashes of every full block of prompt + output so far, computed as blocks fill.
    block_hashes: list[int] = field(default_factory=list)
    # Prompt tokens served from the prefix cache at the first scheduling: whole blocks.
    cached_tokens: int | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_preemptions: int = 0
    finish_reason: SimFinishReason | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def tokens(self, start: int, stop: int) -> list[int]:
        """prompt + output tokens [start, stop)."""
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        head = self.prompt_token_ids[start:] if start < n else []
        return head + self.output_token_ids[max(0, start - n) : stop - n]

    def update_block_hashes(self, block_size: int) -> list[int]:
        """Hash every full block of the tokens so far; returns all hashes."""
        while (len(self.block_hashes) + 1) * block_size <= self.num_tokens:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            salt = self.cache_salt if i == 0 else None
            self.block_hashes.append(chain_hash(parent, self.tokens(i * block_size, (i + 1) * block_size), salt))
        return self.block_hashes

    def is_decode(self, num_new_tokens: int) -> bool:
        """Whether scheduling `num_new_tokens` is one decode step (not a prefill or recompute chunk)."""
        return (num_new_tokens == 1 and bool(self.output_token_ids)
                and self.num_computed_tokens == self.num_tokens - 1)
