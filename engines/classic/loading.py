"""Loading one model: its config (from disk or from a load request) and the versions it selects."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.classic.errors import ConfigError, invalid
from engines.classic.limits import ClassicLimits
from engines.classic.model import ModelVersion
from engines.classic.proto import ModelConfig
from engines.classic.repository import disk as repo
from engines.classic.repository import uploads
from engines.classic.repository.config import load_config, normalise, parse_json, validate
from engines.classic.scheduling.ensemble import validate_ensemble


@dataclass(slots=True)
class ModelEntry:
    name: str
    state: str = "UNAVAILABLE"  # READY | UNAVAILABLE | LOADING | UNLOADING
    reason: str = ""
    config: ModelConfig | None = None
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    fingerprint: tuple[tuple[str, int, int], ...] = ()
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def parse_override(name: str, model_dir: Path, config_json: str | bytes | None,
                   files: dict[str, bytes] | None) -> ModelConfig | None:
    """A load request's config, parsed and validated, and its file paths checked: all before any write."""
    if files:
        if config_json is None:
            raise invalid(f"failed to load '{name}': a 'config' parameter must accompany 'file:' parameters")
        uploads.check_paths(files)
    if config_json is None:
        return None
    try:
        return read_config(model_dir, parse_json(config_json, f"load request for '{name}' (config parameter)"))
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def read_config(model_dir: Path, override: ModelConfig | None) -> ModelConfig:
    """The model's validated config: `override` (a load request's) when given, else its config.pbtxt.

    Raises ConfigError naming the source and the field.
    """
    if override is None:
        config = load_config(model_dir)
    else:
        config = override
        source = f"load request for '{model_dir.name}' (config parameter)"
        normalise(config, model_dir.name, source)
        validate(config, source)
    if config.backend == "ensemble":
        validate_ensemble(config, str(model_dir / "config.pbtxt"))
    return config


async def load_versions(config: ModelConfig, model_dir: Path, host: Any,
                        limits: ClassicLimits) -> dict[str, ModelVersion]:
    """Every version the config's policy selects, by version string; all or none.

    `host` serves BLS calls and ensemble steps. On failure the versions already loaded
    are closed and the error (ConfigError for a bad model) propagates.
    """
    loaded: dict[str, ModelVersion] = {}
    try:
        for v in repo.select_versions(config, model_dir):
            loaded[str(v)] = await ModelVersion.load(config, model_dir / str(v), host, limits)
    except BaseException:
        for mv in loaded.values():
            await mv.close()
        raise
    return loaded
