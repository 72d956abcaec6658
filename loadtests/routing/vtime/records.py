"""What a virtual-time run records: one row per request, one per worker, and the hit-rate bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router import Ranking
from router.index.hashing import block_hashes, cacheable_blocks


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    session: str
    group: str
    worker: str
    arrival_s: float  # when the gateway ranked and dispatched it
    prompt_tokens: int
    max_tokens: int
    predicted_cached_tokens: int
    decision_s: float  # wall seconds of the ranking call (the router's own time, not virtual)
    predicted_ttft_s: float | None
    reason: str = ""
    first_token_s: float | None = None  # when the gateway had the first token (virtual)
    finish_s: float | None = None
    cached_tokens: int = 0  # engine-reported
    completion_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(slots=True)
class WorkerRecord:
    name: str
    busy_s: float = 0.0  # sum of the engine's step durations
    prefill_tokens: int = 0  # prompt tokens computed (uncached, or recomputed after preemption)
    decode_tokens: int = 0


@dataclass(slots=True)
class RunResult:
    requests: list[RequestRecord]
    workers: list[WorkerRecord]
    upper_bound_hit_rate: float  # one worker with an infinite cache seeing every request
    virtual_s: float
    wall_s: float


class Oracle:
    """One engine with an infinite prefix cache that sees every request in arrival order.

    It hits a prompt's leading full blocks that any earlier request computed
    (prompt and output, as the engine caches both), under vLLM's rule that the
    last prompt token is always recomputed; timing is ignored, so it is an upper
    bound on any fleet's engine hit rate for the same arrivals.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seen: set[int] = set()
        self._prompts: dict[str, tuple[Sequence[int], int]] = {}
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def observe(self, ranking: Ranking, prompt: Sequence[int], request_id: str, root: int) -> None:
        chain = ranking.chains.get(self.block_size) or block_hashes(prompt, self.block_size, root)
        n = 0
        for h in chain:
            if h not in self._seen:
                break
            n += 1
        self.hit_tokens += cacheable_blocks(len(prompt), n, self.block_size) * self.block_size
        self.prompt_tokens += len(prompt)
        self._seen.update(chain)
        self._prompts[request_id] = (prompt, root)

    def finished(self, request_id: str, output: Sequence[int]) -> None:
        prompt, root = self._prompts.pop(request_id)
        if (len(prompt) + len(output)) // self.block_size > len(prompt) // self.block_size:
            self._seen.update(block_hashes([*prompt, *output], self.block_size, root))

    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
