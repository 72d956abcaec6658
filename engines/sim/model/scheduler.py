"""Continuous batching with chunked prefill and prefix caching, modelled on vLLM v1. Pure.

One iteration is `schedule(now_s)`, then the step runs (the simulator charges its cost),
then `postprocess(output, end_s)`:

- `schedule(now_s)` picks the step's work within the token budget
  (`max_num_batched_tokens`) and reserves KV blocks for it. Running requests go
  first, in arrival order: each decodes one token or continues its prefill with as
  many prompt tokens as the budget leaves (chunked prefill). Then waiting requests
  that are ready (see `SimRequest.ready_s`) are admitted in order while the budget
  lasts and fewer than `max_num_seqs` run:
  each reuses its longest cached prefix of whole blocks (at most `(n - 1) //
  block_size` of its n tokens' blocks: the last prompt token is always recomputed,
  for its logits) and prefills the rest, chunked. A waiting
  request whose blocks do not fit waits, and so do the ones behind it (FCFS).
- **Preemption, not admission control**: when a running request needs a block and
  none is free, the most recently admitted running request is preempted: its
  blocks are released (they stay cached until evicted) and it goes back to the
  head of the waiting queue, to recompute its tokens later, as vLLM does. A step
  that preempted admits nobody.
- `postprocess` advances each scheduled request, commits its newly full blocks to
  the cache (one `BlockStored` per request per step), draws one output token for
  every request whose tokens are all computed, and retires finished ones.

`add` and `abort` may be called between any two calls; they take effect at the next
`schedule`. Not thread-safe.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engines.sim.model.cache import BlockCache
from engines.sim.model.config import SimConfig, StepWork
from engines.sim.model.kv_events import BlockStored
from engines.sim.model.outputs import EngineCounters, RequestOutput
from engines.sim.model.request import SimFinishReason, SimRequest


@dataclass(frozen=True, slots=True)
class ScheduledItem:
    request: SimRequest
    num_new_tokens: int  # tokens whose KV this step computes
    decode: bool  # one decode token, rather than a prefill (or recompute) chunk


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledItem, ...]
    preempted: tuple[str, ...]
    work: StepWork


class Scheduler:
    def __init__(self, config: SimConfig, cache: BlockCache, counters: EngineCounters) -> None:
        self.config = config
        self.cache = cache
        self.counters = counters
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._requests: dict[str, SimRequest] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, request: SimRequest) -> None:
        """Queue a request; ValueError if its id is already in the engine."""
        if request.request_id in self._requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Remove a request wherever it is and free its blocks; False if unknown (idempotent)."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return False
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        else:
            self.waiting.remove(request)
        request.finish_reason = "abort"
        self.counters.finished["abort"] += 1
        return True

    def schedule(self, now_s: float) -> SchedulerOutput:
        """The step starting at `now_s`: waiting requests not ready by then stay waiting."""
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledItem] = []
        preempted: list[str] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._reserve(request, n, preempted):
                break  # it preempted itself: everything after it is preempted too
            scheduled.append(ScheduledItem(request, n, request.is_decode(n)))
            budget -= n
            i += 1
        if not preempted:
            self._admit(budget, scheduled, now_s)
        return SchedulerOutput(tuple(scheduled), tuple(preempted), _work(scheduled))

    def postprocess(self, output: SchedulerOutput, end_s: float) -> list[RequestOutput]:
        """Advance the scheduled requests by the step that ended at `end_s`."""
        outputs: list[RequestOutput] = []
        for item in output.scheduled:
            request = item.request
            if request.finish_reason is not None:
                continue  # aborted while the step ran
            request.num_computed_tokens += item.num_new_tokens
            self._commit_full_blocks(request)
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk: no token yet
            outputs.append(self._emit_token(request, end_s))
        return outputs

    def _reserve(self, request: SimRequest, n: int, preempted: list[str]) -> bool:
        """Blocks for `n` more tokens of a running request, preempting from the tail if needed."""
        need = self._blocks_for(request.num_computed_tokens + n) - len(request.block_ids)
        while not self.cache.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        request.block_ids += self.cache.allocate(need)
        return True

    def _admit(self, budget: int, scheduled: list[ScheduledItem], now_s: float) -> None:
        block = self.config.block_size
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if request.ready_s > now_s:
                return  # still on its way in (request latency); those behind it are too
            hashes = request.update_block_hashes(block)
            hits = self.cache.match(hashes[: (request.num_tokens - 1) // block])
            computed = len(hits) * block
            n = min(request.num_tokens - computed, budget)
            need = self._blocks_for(computed + n) - len(hits)
            if not self.cache.can_allocate(need, hits):
                return
            self.waiting.popleft()
            self.cache.acquire(hits)
            request.block_ids = hits + self.cache.allocate(need)
            request.num_computed_tokens = computed
            request.num_committed_blocks = len(hits)
            if request.cached_tokens is None:  # reported once, as the first scheduling found it
                request.cached_tokens = computed
            self.counters.prefix_cache_queries += request.num_tokens
            self.counters.prefix_cache_hits += computed
            self.running.append(request)
            scheduled.append(ScheduledItem(request, n, False))
            budget -= n

    def _commit_full_blocks(self, request: SimRequest) -> None:
        block = self.config.block_size
        full = min(request.num_computed_tokens // block, len(request.block_ids))
        start = request.num_committed_blocks
        if full <= start:
            return
        hashes = request.update_block_hashes(block)
        for i in range(start, full):
            self.cache.commit(request.block_ids[i], hashes[i])
        self.cache.record(BlockStored(
            block_hashes=tuple(hashes[start:full]), parent_block_hash=hashes[start - 1] if start else None,
            token_ids=tuple(request.tokens(start * block, full * block)), block_size=block,
            cache_salt=request.cache_salt if start == 0 else None))
        request.num_committed_blocks = full

    def _emit_token(self, request: SimRequest, end_s: float) -> RequestOutput:
        token = request.sampler.next_token(allow_eos=not request.ignore_eos)
        request.output_token_ids.append(token)
        counters = self.counters
        counters.generation_tokens += 1
        ttft_s = itl_s = None
        if request.first_token_s is None:
            request.first_token_s = end_s
            ttft_s = end_s - request.arrival_s
            counters.prompt_tokens += request.num_prompt_tokens
            counters.prompt_tokens_cached += request.cached_tokens or 0
        elif request.last_token_s is not None:
            itl_s = end_s - request.last_token_s
        request.last_token_s = end_s
        reason = self._finish_reason(request, token)
        if reason is not None:
            self._finish(request, reason)
        return RequestOutput(request.request_id, (token,), reason, request.num_prompt_tokens,
                             request.cached_tokens or 0, len(request.output_token_ids), ttft_s, itl_s)

    def _finish_reason(self, request: SimRequest, token: int) -> SimFinishReason | None:
        if not request.ignore_eos and token == self.config.eos_token_id and self.config.eos_prob > 0:
            return "stop"
        if len(request.output_token_ids) >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def _finish(self, request: SimRequest, reason: SimFinishReason) -> None:
        request.finish_reason = reason
        self.running.remove(request)
        self._release(request)
        del self._requests[request.request_id]
        self.counters.finished[reason] += 1

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self._release(request)
        request.num_computed_tokens = 0
        request.num_committed_blocks = 0
        request.num_preemptions += 1
        self.counters.num_preemptions += 1
        self.waiting.appendleft(request)

    def _release(self, request: SimRequest) -> None:
        self.cache.release(request.block_ids)
        request.block_ids = []

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)


def _work(scheduled: list[ScheduledItem]) -> StepWork:
    prefill = pairs = decode = 0
    for item in scheduled:
        if item.decode:
            decode += 1
        else:
            n, s = item.num_new_tokens, item.request.num_computed_tokens
            prefill += n
            pairs += n * s + n * (n + 1) // 2
    return StepWork(prefill_tokens=prefill, prefill_attn_pairs=pairs, decode_seqs=decode)
