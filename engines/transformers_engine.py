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

After `cancel_request` the manager may deliver one more output and never a
final one, so completion is tracked here, not by waiting for the manager's last
output. Every use of transformers' private internals is in `transformers_compat`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engines import transformers_compat as compat
from engines.base import Delta, EngineError, EngineRequest, EngineStats, SamplingParams
from engines.detokenizer import IncrementalDetokenizer
from engines.errors import ErrorKind
from engines.transformers_outputs import OutputStream
from engines.transformers_requests import check_prompt, check_sampling, end_token_ids, sampling_kwargs

if TYPE_CHECKING:
    from transformers import (
        ContinuousBatchingConfig,
        ContinuousBatchingManager,
        GenerationConfig,
        PreTrainedTokenizerBase,
    )
    from transformers.generation.continuous_batching.requests import GenerationOutput

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
    dtype: str = "float32"  # bfloat16 has no native arithmetic on AVX2-only CPUs and runs slower there
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
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.context_length = 2048
        self._manager: ContinuousBatchingManager | None = None
        self._eos_ids: list[int] = []
        self._ready = False
        self._lock = threading.Lock()
        self._active: dict[str, asyncio.Queue[GenerationOutput | _Aborted]] = {}
        self._first_token: set[str] = set()
        self._max_batch_seen = 0
        self._steps = 0
        self._batched_steps = 0

    # -- lifecycle ---------------------------------------------------------
    async def start(self) -> None:
        compat.check_version()
        await asyncio.to_thread(self._load)
        if self.config.warmup:
            await self._warmup()
        self._ready = True

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from engines.seeded_sampler import install_seeded_sampler

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model_dir, dtype=getattr(torch, cfg.dtype), attn_implementation="paged|sdpa"
        )
        module: torch.nn.Module = model  # transformers types `to` and `eval` as unbound Module methods
        module.to(cfg.device).eval()
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self._eos_ids = _eos_ids(model.generation_config.eos_token_id, self.tokenizer.eos_token_id)
        manager = model.init_continuous_batching(generation_config=self._generation_config(),
                                                 continuous_batching_config=self._batching_config())
        compat.require_internals(manager)
        install_seeded_sampler(manager)
        compat.watch_batch_sizes(manager, self._record_batch)
        manager.start()
        self._manager = manager

    def _generation_config(self) -> GenerationConfig:
        from transformers import GenerationConfig

        return GenerationConfig.from_dict({
            "do_sample": True,
            "temperature": _DEFAULT_TEMPERATURE,
            "top_k": _DEFAULT_TOP_K,
            "top_p": _DEFAULT_TOP_P,
            "max_new_tokens": 256,
            "eos_token_id": self._eos_ids,
            "pad_token_id": self._eos_ids[0] if self._eos_ids else 0,
        })

    def _batching_config(self) -> ContinuousBatchingConfig:
        from transformers import ContinuousBatchingConfig

        cfg = self.config
        return ContinuousBatchingConfig(
            per_request_processors=True,
            max_requests_per_batch=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            num_blocks=cfg.kv_num_blocks,
            page_size=cfg.kv_page_size,
            use_cuda_graph=False,
        )

    def _record_batch(self, size: int) -> None:
        self._max_batch_seen = max(self._max_batch_seen, size)
        self._steps += 1
        if size > 1:
            self._batched_steps += 1

    async def _warmup(self) -> None:
        """The first batch is slow (allocation, kernel selection); pay it before serving."""
        ids = self._tokenizer().encode("Hello")
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
        return EngineStats(running=total, waiting=total - running, max_batch_size_seen=self._max_batch_seen,
                           steps=self._steps, batched_steps=self._batched_steps)

    # -- requests ----------------------------------------------------------
    async def generate(self, request: EngineRequest) -> AsyncGenerator[Delta, None]:
        manager = self._manager
        if manager is None:
            raise EngineError("engine is not running", ErrorKind.UNAVAILABLE, retryable=True)
        check_sampling(request.sampling)
        check_prompt(request.prompt_token_ids, len(self._tokenizer()), self.context_length)
        rid = request.request_id
        queue: asyncio.Queue[GenerationOutput | _Aborted] = asyncio.Queue()
        with self._lock:
            if rid in self._active:
                raise EngineError(f"request id {rid!r} is already running", ErrorKind.ALREADY_EXISTS)
            self._active[rid] = queue
        s = request.sampling
        stream = OutputStream(IncrementalDetokenizer(self._decode, s.stop, s.include_stop_str_in_output),
                              len(request.prompt_token_ids), {*self._eos_ids, *s.stop_token_ids})
        try:
            manager.register_result_handler(rid, queue.put_nowait)
            await asyncio.to_thread(self._submit, request)
            while True:
                out = await queue.get()
                if isinstance(out, _Aborted):
                    yield stream.aborted()
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
            self._forget(rid, cancel=not stream.manager_done)

    def _submit(self, request: EngineRequest) -> None:
        s = request.sampling
        manager = self._manager
        rid = None if manager is None else manager.add_request(
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
        compat.sink_result_handler(manager, rid)
        asyncio.get_running_loop().call_later(_LATE_OUTPUT_GRACE_S, self._drop_handler, rid)

    def _drop_handler(self, rid: str) -> None:
        if self._manager is not None:
            compat.drop_result_handler(self._manager, rid)

    def _tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise EngineError("engine is not running", ErrorKind.UNAVAILABLE, retryable=True)
        return self.tokenizer

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=True))


# How long a finished request's sink handler stays registered for late outputs.
_LATE_OUTPUT_GRACE_S = 30.0


def _eos_ids(model_eos: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    ids = [model_eos] if isinstance(model_eos, int) else list(model_eos or [])
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids.append(tokenizer_eos)
    return ids


class _Aborted:
    """Queue item that ends a request's stream with finish_reason "abort"."""
