"""The transformers engine's configuration, its model (loaded once), and its managers (one per life).

A `ContinuousBatchingManager` owns the background thread that runs the batch. When that
thread dies the manager cannot be started again with the same state, so every restart
builds a fresh one over the model already in memory (`new_manager`); the weights are
loaded only once (`load_model`). Blocking: call both from a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.supervision import Backoff
from engines.transformers import compat

if TYPE_CHECKING:
    from transformers import (
        ContinuousBatchingConfig,
        ContinuousBatchingManager,
        GenerationConfig,
        PreTrainedTokenizerBase,
    )

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
    # A warm-up that takes longer than this fails the start (or the restart, which is retried).
    warmup_timeout_s: float = 300.0
    # Delays between restarts after the generation loop died.
    restart_backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.warmup_timeout_s <= 0:
            raise ValueError(f"warmup_timeout_s must be > 0, got {self.warmup_timeout_s}")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    tokenizer: PreTrainedTokenizerBase
    model: Any  # a transformers PreTrainedModel with continuous batching
    context_length: int
    eos_ids: list[int]


def load_model(cfg: TransformersEngineConfig) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        cfg.model_dir, dtype=getattr(torch, cfg.dtype), attn_implementation="paged|sdpa"
    )
    module: torch.nn.Module = model  # transformers types `to` and `eval` as unbound Module methods
    module.to(cfg.device).eval()
    context_length = int(getattr(model.config, "max_position_embeddings", 2048))
    eos_ids = _eos_ids(model.generation_config.eos_token_id, tokenizer.eos_token_id)
    return LoadedModel(tokenizer, model, context_length, eos_ids)


def new_manager(loaded: LoadedModel, cfg: TransformersEngineConfig,
                record_batch: Callable[[int], None]) -> ContinuousBatchingManager:
    """A fresh, started manager over the loaded model, with seeded sampling and batch-size watching."""
    from engines.transformers.sampler import install_seeded_sampler

    manager: ContinuousBatchingManager = loaded.model.init_continuous_batching(
        generation_config=_generation_config(loaded.eos_ids), continuous_batching_config=_batching_config(cfg))
    compat.require_internals(manager)
    install_seeded_sampler(manager)
    compat.watch_batch_sizes(manager, record_batch)
    manager.start()
    return manager


def _generation_config(eos_ids: list[int]) -> GenerationConfig:
    from transformers import GenerationConfig

    return GenerationConfig.from_dict({
        "do_sample": True,
        "temperature": _DEFAULT_TEMPERATURE,
        "top_k": _DEFAULT_TOP_K,
        "top_p": _DEFAULT_TOP_P,
        "max_new_tokens": 256,
        "eos_token_id": eos_ids,
        "pad_token_id": eos_ids[0] if eos_ids else 0,
    })


def _batching_config(cfg: TransformersEngineConfig) -> ContinuousBatchingConfig:
    from transformers import ContinuousBatchingConfig

    return ContinuousBatchingConfig(
        per_request_processors=True,
        max_requests_per_batch=cfg.max_batch_size,
        max_batch_tokens=cfg.max_batch_tokens,
        num_blocks=cfg.kv_num_blocks,
        page_size=cfg.kv_page_size,
        use_cuda_graph=False,
    )


def _eos_ids(model_eos: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    ids = [model_eos] if isinstance(model_eos, int) else list(model_eos or [])
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids.append(tokenizer_eos)
    return ids
