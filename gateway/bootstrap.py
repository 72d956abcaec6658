"""Loading models after the server is listening, so /health can say 503 meanwhile."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engines.weights import read_llm_parameters, resolve_weights
from gateway.backends import LocalBackend
from gateway.state import AppState

log = logging.getLogger("sluice.bootstrap")


@dataclass(frozen=True, slots=True)
class LLMSpec:
    """An LLM to serve: a name and a local transformers directory (or a remote worker set)."""

    name: str
    model_dir: Path | None
    engine: str = "transformers"
    dtype: str = "float32"
    max_batch_size: int = 32


def repository_llms(repository: Path, only: tuple[str, ...] = ()) -> list[tuple[str, Path, dict[str, str]]]:
    """(name, config path, parameters) of every `backend: "llm"` model in the repository."""
    out = []
    for cfg in sorted(Path(repository).glob("*/config.pbtxt")):
        if "backend" not in cfg.read_text() or '"llm"' not in cfg.read_text():
            continue
        try:
            params = read_llm_parameters(cfg)
        except ValueError:
            continue
        name = cfg.parent.name
        if only and name not in only:
            continue
        out.append((name, cfg, params))
    return out


def llm_specs_from_repository(repository: Path, only: tuple[str, ...] = ()) -> list[LLMSpec]:
    specs = []
    for name, cfg, params in repository_llms(repository, only):
        model_dir = resolve_weights(params["weights"], cfg.parent, name)
        specs.append(LLMSpec(name, model_dir, params.get("engine", "transformers"),
                             params.get("dtype", "float32"), int(params.get("max_batch_size", "32"))))
    return specs


async def start_local_llm(state: AppState, spec: LLMSpec) -> None:
    """Start an in-process transformers engine and register it with the LLM service."""
    from engines.tokenizer import ChatTokenizer
    from engines.transformers_engine import TransformersEngine, TransformersEngineConfig

    if spec.model_dir is None:
        raise ValueError(f"model {spec.name!r} has no local weights")
    cfg = TransformersEngineConfig(model_dir=spec.model_dir, name=spec.name, dtype=spec.dtype,
                                   max_batch_size=min(spec.max_batch_size, state.settings.engine_max_batch_size))
    engine = TransformersEngine(cfg)
    state.llm.pending.add(spec.name)
    await engine.start()
    model = state.llm.add_model(spec.name, ChatTokenizer(spec.model_dir, engine.tokenizer),
                                engine.context_length, LocalBackend("local", engine))
    model.root = str(spec.model_dir)
    state.llm.pending.discard(spec.name)
    log.info("model %s ready (transformers, %s, context %d)", spec.name, spec.dtype, engine.context_length)


async def stop_engines(state: AppState) -> None:
    for model in list(state.llm.models.values()):
        for _, engine in model.backend.engines():
            try:
                await engine.stop()
            except Exception:
                log.exception("stopping engine of %s failed", model.name)
