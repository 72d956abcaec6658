"""In-process LLM engines: which repository models to run here, and starting them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from engines.weights import resolve_weights
from gateway.llm.registry import ModelRegistry
from gateway.llm.targets import LocalBackend

log = logging.getLogger("sluice.llm")


@dataclass(frozen=True, slots=True)
class LLMSpec:
    """An LLM to serve in-process: a name and a local transformers directory."""

    name: str
    model_dir: Path
    dtype: str = "float32"
    max_batch_size: int = 32


def specs_from_configs(configs: dict[str, mc.ModelConfig], repository: Path, only: tuple[str, ...] = ()
                       ) -> list[LLMSpec]:
    """The `backend: "llm"` models the repository manager loaded, as specs (weights resolved,
    converting a GGUF once into the cache)."""
    specs = []
    for name, config in sorted(configs.items()):
        if only and name not in only:
            continue
        params = {k: v.string_value for k, v in config.parameters.items()}
        if "weights" not in params:
            raise ValueError(f"{repository / name / 'config.pbtxt'}: parameter 'weights' is missing")
        model_dir = resolve_weights(params["weights"], repository / name, name)
        specs.append(LLMSpec(name, model_dir, params.get("dtype", "float32"),
                             int(params.get("max_batch_size", "32"))))
    return specs


async def start_local_llm(registry: ModelRegistry, spec: LLMSpec, max_batch_size: int) -> None:
    """Start an in-process transformers engine and add it to the registry once warm."""
    from engines.text.tokenizer import ChatTokenizer
    from engines.transformers.engine import TransformersEngine, TransformersEngineConfig

    cfg = TransformersEngineConfig(model_dir=spec.model_dir, name=spec.name, dtype=spec.dtype,
                                   max_batch_size=min(spec.max_batch_size, max_batch_size))
    engine = TransformersEngine(cfg)
    registry.pending.add(spec.name)
    await engine.start()
    model = registry.add(spec.name, ChatTokenizer(spec.model_dir, engine.tokenizer), engine.context_length,
                         LocalBackend("local", engine), capacity=cfg.max_batch_size)
    model.root = str(spec.model_dir)
    log.info("model %s ready (transformers, %s, context %d)", spec.name, spec.dtype, engine.context_length)


async def stop_local_engines(registry: ModelRegistry) -> None:
    for model in list(registry.models.values()):
        if not isinstance(model.backend, LocalBackend):
            continue
        try:
            await model.backend.engine.stop()
        except Exception:
            log.exception("stopping engine of %s failed", model.name)
