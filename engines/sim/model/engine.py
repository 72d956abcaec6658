"""`SimEngine`: a modelled vLLM engine with no I/O and no clock of its own.

Time is whatever the caller says it is, so one engine model serves two drivers:
the live HTTP worker (`engines.sim.serving.driver`, which sleeps each step's duration in
real time) and a discrete-event simulation in virtual time (many engines, no
sockets, no sleeping). The driving API:

- ``add_request(spec, now_s)``: a request arrives. It is scheduled at the next step.
- ``abort(request_id) -> bool``: it leaves the engine and frees its blocks (idempotent).
- ``step(now_s) -> StepResult``: run one engine step. It starts at
  ``max(now_s, end of the previous step)`` and lasts ``duration_s`` from the cost
  model; its outputs (at most one token per running request) and KV events exist
  at ``result.end_s``: deliver them then. A step with nothing to run is idle
  (``duration_s == 0``, no outputs).
- ``next_event_time() -> float | None``: when the engine next wants to step: the
  end of the current step while requests run, else when the first waiting request
  becomes schedulable (``request_latency_s`` after its arrival), None when it has
  no work (it then waits for ``add_request``).

A discrete-event loop therefore calls ``step(t)`` whenever ``next_event_time()``
comes due, delivers the result at ``end_s``, and calls ``add_request`` at
arrival times; the engine never looks at a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engines.sim.model.cache import BlockCache
from engines.sim.model.config import SimConfig
from engines.sim.model.outputs import EngineCounters, StepResult
from engines.sim.model.request import SimRequest, TokenSampler
from engines.sim.model.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A request as it arrives: token ids (already rendered and tokenized) and limits."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int  # new tokens at most (the engine also stops at max_model_len)
    seed: int  # the output tokens are a function of this (see request.derive_seed)
    ignore_eos: bool = False
    cache_salt: str | None = None  # requests with different salts never share blocks


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The scheduler's gauges now (vllm:num_requests_running, _waiting, kv_cache_usage_perc)."""

    running: int
    waiting: int
    kv_usage: float
    cached_blocks: int


class SimEngine:
    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.cache = BlockCache(config.num_gpu_blocks, config.block_size)
        self.counters = EngineCounters()
        self.scheduler = Scheduler(config, self.cache, self.counters)
        self._busy_until_s = float("-inf")

    def add_request(self, spec: RequestSpec, now_s: float) -> None:
        """Queue a request. ValueError for one no engine would run (the HTTP layer
        checks first and answers as vLLM does)."""
        n = len(spec.prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n >= self.config.max_model_len:
            raise ValueError(f"a prompt of {n} tokens leaves no room in max_model_len {self.config.max_model_len}")
        if spec.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {spec.max_tokens}")
        cfg = self.config
        sampler = TokenSampler(spec.seed, cfg.vocab_size, cfg.special_token_ids, cfg.eos_token_id, cfg.eos_prob)
        self.scheduler.add(SimRequest(spec.request_id, list(spec.prompt_token_ids), spec.max_tokens, sampler,
                                      arrival_s=now_s, ready_s=now_s + cfg.cost.request_latency_s,
                                      ignore_eos=spec.ignore_eos, cache_salt=spec.cache_salt))

    def abort(self, request_id: str) -> bool:
        return self.scheduler.abort(request_id)

    def step(self, now_s: float) -> StepResult:
        """Schedule, run (charge the cost model) and postprocess one step; see the module docstring."""
        start_s = max(now_s, self._busy_until_s)
        out = self.scheduler.schedule(start_s)
        duration_s = self.config.cost.step_s(out.work)
        end_s = start_s + duration_s
        outputs = self.scheduler.postprocess(out, end_s)
        self._busy_until_s = end_s
        if out.scheduled:
            c = self.counters
            c.steps += 1
            c.batched_steps += len(out.scheduled) > 1
            c.max_batch = max(c.max_batch, len(out.scheduled))
        return StepResult(start_s, duration_s, tuple(outputs), tuple(self.cache.take_events()),
                          out.work.prefill_tokens, out.work.decode_seqs, out.preempted)

    def next_event_time(self) -> float | None:
        sched = self.scheduler
        if sched.running:
            return self._busy_until_s
        if sched.waiting:  # nothing runs: the head of the queue decides (it may not be ready yet)
            return max(self._busy_until_s, sched.waiting[0].ready_s)
        return None

    def has_request(self, request_id: str) -> bool:
        return request_id in self.scheduler

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (an AllBlocksCleared event); False while requests hold blocks."""
        return self.cache.reset()

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(len(self.scheduler.running), len(self.scheduler.waiting), self.cache.usage,
                              self.cache.num_cached)
