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
- stop strings are applied here (detokenizer), stop token ids as extra EOS ids.

Pitfall (ENVIRONMENT.md): after `cancel_request` the manager may deliver one
more chunk and never a final one, so completion is tracked here, not by waiting
for the manager's last output.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator

from engines.base import Delta, EngineError, EngineRequest, EngineStats
from engines.detokenizer import IncrementalDetokenizer
from engines.errors import ErrorKind

log = logging.getLogger(__name__)

# transformers creates a per-request processor only when the global default is
# not the neutral value, so the defaults here are deliberately non-neutral.
# Every request passes its own values, so these never apply.
_DEFAULT_TEMPERATURE = 0.5
_DEFAULT_TOP_K = 1000
_DEFAULT_TOP_P = 0.99


@dataclass(frozen=True, slots=True)
class TransformersEngineConfig:
    model_dir: Path
    name: str
    dtype: str = "float32"  # bf16 is slow on AVX2 CPUs (ENVIRONMENT.md)
    device: str = "cpu"
    max_batch_size: int = 32  # requests in one running batch
    max_batch_tokens: int = 2048  # prefill+decode tokens in one forward pass
    kv_num_blocks: int = 128
    kv_page_size: int = 256  # tokens per KV block
    warmup: bool = True

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


class TransformersEngine:
    """In-process engine; see the module docstring for how it maps the contract."""

    def __init__(self, config: TransformersEngineConfig) -> None:
        self.config = config
        self.name = config.name
        self.tokenizer: Any = None
        self.context_length = 2048
        self._manager: Any = None
        self._eos_ids: list[int] = []
        self._ready = False
        self._lock = threading.Lock()
        self._active: dict[str, asyncio.Queue[Any]] = {}
        self._first_token: set[str] = set()
        self._max_batch_seen = 0

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        if self.config.warmup:
            await self._warmup()
        self._ready = True

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        from engines.seeded_sampler import install_seeded_sampler

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model_dir, dtype=getattr(torch, cfg.dtype), attn_implementation="paged|sdpa"
        ).to(cfg.device)
        model.eval()
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        eos = model.generation_config.eos_token_id
        self._eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in self._eos_ids:
            self._eos_ids.append(self.tokenizer.eos_token_id)
        gen = GenerationConfig(
            do_sample=True,
            temperature=_DEFAULT_TEMPERATURE,
            top_k=_DEFAULT_TOP_K,
            top_p=_DEFAULT_TOP_P,
            max_new_tokens=256,
            eos_token_id=self._eos_ids,
            pad_token_id=self._eos_ids[0] if self._eos_ids else 0,
        )
        cb = ContinuousBatchingConfig(
            per_request_processors=True,
            max_requests_per_batch=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            num_blocks=cfg.kv_num_blocks,
            page_size=cfg.kv_page_size,
            use_cuda_graph=False,
        )
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        install_seeded_sampler(manager)
        self._watch_batches(manager)
        manager.start()
        self._manager = manager

    def _watch_batches(self, manager: Any) -> None:
        """Record the largest batch the manager schedules, to make batching observable."""
        engine = self

        original = type(manager)._create_batch_processor

        def create(self_: Any) -> Any:
            processor = original(self_)
            scheduler = processor.scheduler
            schedule = scheduler.schedule_batch

            def schedule_batch(*args: Any, **kwargs: Any) -> Any:
                result = schedule(*args, **kwargs)
                batch = result[0]
                if batch:
                    engine._max_batch_seen = max(engine._max_batch_seen, len(batch))
                return result

            scheduler.schedule_batch = schedule_batch
            return processor

        # Bound to this manager only: other managers in the process are unaffected.
        manager._create_batch_processor = create.__get__(manager)

    async def _warmup(self) -> None:
        """The first batch is slow (allocation, kernel selection); pay it before serving."""
        from engines.base import SamplingParams

        ids = self.tokenizer.encode("Hello")
        req = EngineRequest("warmup", self.name, ids, SamplingParams(max_tokens=4, temperature=0.0))
        async for _ in self.generate(req):
            pass
        self._max_batch_seen = 0

    async def stop(self) -> None:
        self._ready = False
        if self._manager is not None:
            manager, self._manager = self._manager, None
            await asyncio.to_thread(manager.stop, True, 10)

    def ready(self) -> bool:
        return self._ready and self._manager is not None and self._manager.is_running()

    def stats(self) -> EngineStats:
        with self._lock:
            total = len(self._active)
            running = len(self._first_token & set(self._active))
        return EngineStats(running=total, waiting=total - running, max_batch_size_seen=self._max_batch_seen)

    # -- requests ----------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        if self._manager is None:
            raise EngineError("engine is not running", ErrorKind.UNAVAILABLE, retryable=True)
        s = request.sampling
        if s.logprobs is not None:
            raise EngineError("logprobs are not supported by the transformers engine", ErrorKind.UNSUPPORTED,
                              param="logprobs")
        if s.min_p or s.repetition_penalty != 1.0 or s.presence_penalty or s.frequency_penalty or s.min_tokens:
            raise EngineError(
                "min_p, min_tokens and repetition/presence/frequency penalties are not supported by the "
                "transformers engine", ErrorKind.UNSUPPORTED)
        self._check_prompt(request.prompt_token_ids)
        rid = request.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            if rid in self._active:
                raise EngineError(f"request id {rid!r} is already running", ErrorKind.ALREADY_EXISTS)
            self._active[rid] = queue
        detok = IncrementalDetokenizer(self._decode, s.stop, s.include_stop_str_in_output)
        finished = False
        try:
            self._manager.register_result_handler(rid, queue.put_nowait)
            await asyncio.to_thread(self._submit, request)
            sent = 0
            while True:
                out = await queue.get()
                if isinstance(out, _Aborted):
                    yield Delta(finish_reason="abort", completion_tokens=sent,
                                prompt_tokens=len(request.prompt_token_ids))
                    return
                if out.error:
                    finished = True
                    yield Delta(finish_reason="error", error=str(out.error), completion_tokens=sent,
                                prompt_tokens=len(request.prompt_token_ids))
                    return
                new = list(out.generated_tokens[sent:])
                if new:
                    with self._lock:
                        self._first_token.add(rid)
                done = out.is_finished()
                reason = None
                if done:
                    last = out.generated_tokens[-1] if out.generated_tokens else None
                    reason = "stop" if (last in self._eos_ids or last in s.stop_token_ids) else "length"
                    # The EOS / stop token is not part of the visible text.
                    if reason == "stop" and new and new[-1] == last:
                        new = new[:-1]
                step = detok.step(new, last=done)
                sent = len(out.generated_tokens)
                if step.stopped:
                    done, reason = True, "stop"
                if step.text or new or done:
                    yield Delta(text=step.text, token_ids=new, finish_reason=reason,
                                prompt_tokens=len(request.prompt_token_ids), completion_tokens=sent)
                if done:
                    finished = not step.stopped or out.is_finished()
                    return
        finally:
            self._forget(rid, cancel=not finished)

    def _check_prompt(self, ids: list[int]) -> None:
        # A bad id would kill the manager's background thread for every request.
        vocab = len(self.tokenizer)
        if not ids:
            raise EngineError("the prompt is empty", ErrorKind.INVALID_ARG, param="prompt")
        for t in ids:
            if type(t) is not int or not 0 <= t < vocab:
                raise EngineError(f"token id {t!r} is outside the vocabulary [0, {vocab})",
                                  ErrorKind.INVALID_ARG, param="prompt")
        if len(ids) >= self.context_length:
            raise EngineError(f"the prompt has {len(ids)} tokens; the context is {self.context_length}",
                              ErrorKind.CONTEXT_TOO_LONG, code="context_length_exceeded", param="messages")

    def _submit(self, request: EngineRequest) -> None:
        s = request.sampling
        kwargs: dict[str, Any] = {
            "temperature": 1.0 if s.greedy else float(s.temperature),
            "top_k": 1 if s.greedy else (s.top_k if s.top_k > 0 else self.tokenizer.vocab_size),
            "top_p": 1.0 if s.greedy else float(s.top_p),
            "sluice_seed": -1 if (s.seed is None or s.greedy) else int(s.seed) & 0x7FFFFFFF,
        }
        eos = [] if s.ignore_eos else list(self._eos_ids)
        eos += [t for t in s.stop_token_ids if t not in eos]
        rid = self._manager.add_request(
            input_ids=request.prompt_token_ids,
            request_id=request.request_id,
            max_new_tokens=max(1, s.max_tokens),
            streaming=True,
            eos_token_id=eos or -1,
            **kwargs,
        )
        if rid is None:
            raise EngineError("engine is not accepting requests", ErrorKind.UNAVAILABLE, retryable=True)

    async def abort(self, request_id: str) -> None:
        queue = self._active.get(request_id)
        if queue is not None:
            # Wake the generator; its finally block cancels in the manager.
            queue.put_nowait(_Aborted())

    def _forget(self, rid: str, *, cancel: bool) -> None:
        with self._lock:
            self._active.pop(rid, None)
            self._first_token.discard(rid)
        manager = self._manager
        if manager is None:
            return
        if cancel:
            manager.cancel_request(rid)
        # Keep a sink registered for late outputs so they do not pile up in the
        # manager's shared queue; drop it after a grace period.
        router = manager.output_router
        with router._lock:
            entry = router.result_handlers.get(rid)
            if entry is not None:
                router.result_handlers[rid] = (lambda _out: None, entry[1])
        loop = asyncio.get_event_loop()
        loop.call_later(30.0, self._drop_handler, rid)

    def _drop_handler(self, rid: str) -> None:
        manager = self._manager
        if manager is not None:
            with manager.output_router._lock:
                manager.output_router.result_handlers.pop(rid, None)

    def _decode(self, ids: Any) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _Aborted:
    """Queue item that ends a request's stream with finish_reason "abort"."""
