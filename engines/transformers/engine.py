"""An LLM engine on transformers' own continuous batching.

One `ContinuousBatchingManager` runs a background thread that schedules every
admitted request into a shared batch (paged attention, per-request sampling).
This module adapts it to the `LLMEngine` contract:

- results reach the event loop through `register_result_handler`, one asyncio
  queue per request;
- sampling is per request: temperature, top-k and top-p use transformers'
  per-request processors; greedy is top-k 1; a seeded request draws its token
  from its own generator (see `SeededSampler`), so its output does not depend on
  what else shares the batch;
- stop strings are applied here (detokenizer), stop token ids as extra EOS ids;
- an `EngineSupervisor` watches the background thread: if it dies, every open
  request ends with an error Delta, new ones are refused (UNAVAILABLE) and a fresh,
  warmed-up manager replaces the dead one (`restart`).

After `cancel_request` the manager may deliver one more output and never a
final one, so completion is tracked here, not by waiting for the manager's last
output. Every use of transformers' private internals is in `engines.transformers.compat`;
loading and building managers is in `engines.transformers.loading`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from engines import heap
from engines.base import Delta, EngineError, EngineRequest, EngineStats, SamplingParams
from engines.errors import ErrorKind
from engines.text.detokenizer import IncrementalDetokenizer
from engines.transformers import compat
from engines.transformers.loading import LoadedModel, TransformersEngineConfig, load_model, new_manager
from engines.transformers.outputs import OutputStream
from engines.transformers.requests import check_prompt, check_sampling, end_token_ids, sampling_kwargs
from engines.transformers.supervisor import EngineSupervisor

if TYPE_CHECKING:
    from transformers import ContinuousBatchingManager, PreTrainedTokenizerBase
    from transformers.generation.continuous_batching.requests import GenerationOutput

log = logging.getLogger(__name__)
__all__ = ["TransformersEngine", "TransformersEngineConfig"]

# How long a finished request's sink handler stays registered for late outputs.
_LATE_OUTPUT_GRACE_S = 30.0
_WARMUP_POLL_S = 0.25  # how often a warm-up checks that the generation loop is still alive


@dataclass(frozen=True, slots=True)
class _Ended:
    """Queue item that ends a request's stream: an abort (error None) or an engine failure."""

    error: str | None = None


class TransformersEngine:
    """In-process engine; see the module docstring for how it maps the contract."""

    def __init__(self, config: TransformersEngineConfig) -> None:
        self.config = config
        self.name = config.name
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.context_length = 2048
        self._loaded: LoadedModel | None = None
        self._manager: ContinuousBatchingManager | None = None
        self._eos_ids: list[int] = []
        self._ready = False
        self._lock = threading.Lock()
        self._active: dict[str, asyncio.Queue[GenerationOutput | _Ended]] = {}
        self._first_token: set[str] = set()
        self._max_batch_seen = 0
        self._steps = 0
        self._batched_steps = 0
        self._supervisor = EngineSupervisor(config.name, self, backoff=config.restart_backoff)
        self._creating: asyncio.Future[ContinuousBatchingManager] | None = None

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        compat.check_version()
        loaded = await asyncio.to_thread(load_model, self.config)
        self._loaded, self.tokenizer = loaded, loaded.tokenizer
        self.context_length, self._eos_ids = loaded.context_length, loaded.eos_ids
        await self._start_manager()
        self._supervisor.start()

    async def _start_manager(self) -> None:
        assert self._loaded is not None
        # Shielded: if a stop cancels a restart here, the thread still finishes building a manager
        # (with a running, non-daemon thread), and stop() must find it to stop it.
        self._creating = asyncio.ensure_future(
            asyncio.to_thread(new_manager, self._loaded, self.config, self._record_batch))
        self._manager = await asyncio.shield(self._creating)
        if self.config.warmup:
            await asyncio.wait_for(self._warmup(self._manager), self.config.warmup_timeout_s)
        self._ready = True

    def _record_batch(self, size: int) -> None:
        self._max_batch_seen = max(self._max_batch_seen, size)
        self._steps += 1
        if size > 1:
            self._batched_steps += 1

    async def _warmup(self, manager: ContinuousBatchingManager) -> None:
        """The first batch is slow (allocation, kernel selection); pay it before serving.
        Raises RuntimeError if the generation loop fails or dies meanwhile."""
        ids = self._tokenizer().encode("Hello")
        req = EngineRequest("warmup", self.name, ids, SamplingParams(max_tokens=4, temperature=0.0))
        task = asyncio.ensure_future(_last_delta(self._stream(req, require_ready=False)))
        try:
            while not (await asyncio.wait({task}, timeout=_WARMUP_POLL_S))[0]:
                if not manager.is_running():
                    raise RuntimeError(f"the generation loop of {self.name} died during warm-up")
            last = task.result()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if last is None or last.finish_reason == "error":
            raise RuntimeError(f"warm-up of {self.name} failed: {last.error if last else 'no output'}")
        self._max_batch_seen = 0

    async def stop(self) -> None:
        self._ready = False
        await self._supervisor.stop()
        creating, self._creating = self._creating, None
        if self._manager is None and creating is not None:
            built = (await asyncio.gather(creating, return_exceptions=True))[0]
            self._manager = None if isinstance(built, BaseException) else built
        if self._manager is not None:
            manager, self._manager = self._manager, None
            await asyncio.to_thread(manager.stop, True, 10)

    def ready(self) -> bool:
        return self._ready and self.loop_alive()

    def stats(self) -> EngineStats:
        with self._lock:
            total = len(self._active)
            running = len(self._first_token & set(self._active))
        return EngineStats(running=total, waiting=total - running, max_batch_size_seen=self._max_batch_seen,
                           steps=self._steps, batched_steps=self._batched_steps,
                           restarts=self._supervisor.restarts)

    # -- supervision (engines.transformers.supervisor.SupervisedEngine) ------------
    def loop_alive(self) -> bool:
        manager = self._manager
        return manager is not None and manager.is_running()

    def fail_in_flight(self, reason: str) -> int:
        self._ready = False
        with self._lock:
            queues = list(self._active.values())
        for queue in queues:
            queue.put_nowait(_Ended(reason))
        return len(queues)

    async def restart(self) -> None:
        self._ready = False
        heap.thaw()  # the dead loop's traceback cycle holds its batch and KV cache (engines/heap.py)
        old, self._manager = self._manager, None
        if old is not None:
            try:  # joins the dead thread and releases its cache
                await asyncio.to_thread(old.stop, True, 10)
            except Exception:
                log.warning("engine %s: stopping the dead manager failed", self.name, exc_info=True)
        await self._start_manager()  # ready again only once warm; if it raises, the supervisor retries

    # -- requests ----------------------------------------------------------
    def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        return self._stream(request, require_ready=True)

    async def _stream(self, request: EngineRequest, *, require_ready: bool) -> AsyncGenerator[Delta, None]:
        manager = self._manager
        if manager is None or (require_ready and not self._ready):
            raise EngineError(f"the engine {self.name} is not running (restarting?); retry shortly",
                              ErrorKind.UNAVAILABLE, retryable=True, retry_after_s=2.0)
        check_sampling(request.sampling)
        check_prompt(request.prompt_token_ids, len(self._tokenizer()), self.context_length)
        rid = request.request_id
        queue: asyncio.Queue[GenerationOutput | _Ended] = asyncio.Queue()
        with self._lock:
            if rid in self._active:
                raise EngineError(f"request id {rid!r} is already running", ErrorKind.ALREADY_EXISTS)
            self._active[rid] = queue
        s = request.sampling
        stream = OutputStream(IncrementalDetokenizer(self._decode, s.stop, s.include_stop_str_in_output),
                              len(request.prompt_token_ids), {*self._eos_ids, *s.stop_token_ids})
        try:
            manager.register_result_handler(rid, queue.put_nowait)
            await asyncio.to_thread(self._submit, manager, request)
            while True:
                out = await queue.get()
                if isinstance(out, _Ended):
                    yield stream.aborted() if out.error is None else stream.failed(out.error)
                    return
                if out.generated_tokens and not out.error:
                    with self._lock:
                        self._first_token.add(rid)
                delta = stream.on_output(out)
                if delta is not None:
                    yield delta
                    if delta.finish_reason is not None:
                        return
        finally:
            self._forget(rid, manager, cancel=not stream.manager_done)

    def _submit(self, manager: ContinuousBatchingManager, request: EngineRequest) -> None:
        s = request.sampling
        rid = manager.add_request(
            input_ids=request.prompt_token_ids,
            request_id=request.request_id,
            max_new_tokens=max(1, s.max_tokens),
            streaming=True,
            eos_token_id=end_token_ids(s, self._eos_ids) or -1,
            **sampling_kwargs(s, self._tokenizer().vocab_size),
        )
        if rid is None:
            raise EngineError("engine is not accepting requests", ErrorKind.UNAVAILABLE, retryable=True)

    async def abort(self, request_id: str) -> None:
        queue = self._active.get(request_id)
        if queue is not None:
            # Wake the generator; its finally block cancels in the manager.
            queue.put_nowait(_Ended())

    def _forget(self, rid: str, manager: ContinuousBatchingManager, *, cancel: bool) -> None:
        with self._lock:
            self._active.pop(rid, None)
            self._first_token.discard(rid)
        if cancel:
            manager.cancel_request(rid)
        # Keep a sink registered for late outputs so they do not pile up in the
        # manager's shared queue; drop it after a grace period.
        compat.sink_result_handler(manager, rid)
        asyncio.get_running_loop().call_later(_LATE_OUTPUT_GRACE_S, partial(compat.drop_result_handler, manager, rid))

    def _tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise EngineError("engine is not running", ErrorKind.UNAVAILABLE, retryable=True)
        return self.tokenizer

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=True))


async def _last_delta(stream: AsyncGenerator[Delta, None]) -> Delta | None:
    last: Delta | None = None
    async for delta in stream:
        last = delta
    return last
