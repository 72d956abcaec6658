"""One frozen settings object per process, read from the CLI and the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001  # 0 disables gRPC
    model_repository: Path | None = Path("model_repository")
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: tuple[str, ...] = ()
    # LLM serving
    workers: tuple[str, ...] = ()  # remote worker URLs (--worker [NAME=]URL)
    workers_file: Path | None = None  # YAML list of worker records
    redis_url: str | None = None  # share routing state between gateway replicas
    router_config: Any = None  # router.RouterConfig; None: defaults with routing_policy
    routing_policy: str = "prefix"
    max_running: int = 64  # admitted requests per model
    max_queued: int = 256  # waiting requests per model before 503
    max_body_bytes: int = 8 * 1024 * 1024
    sse_ping_s: float = field(default_factory=lambda: _env_float("SLUICE_SSE_PING_S", 5.0))
    engine_max_batch_size: int = 32
    log_prompts: bool = False  # never on by default: prompts are user data
    # repr=False: settings get logged; the key must never be.
    admin_key: str | None = field(default_factory=lambda: os.environ.get("SLUICE_ADMIN_KEY") or None, repr=False)
    # Worker mode (`sluice worker --engine transformers --gateway URL`): register there once ready.
    register_with: str | None = None
    worker_name: str | None = None
    advertise_url: str | None = None
    served_llms: tuple[str, ...] = ()  # restrict which LLMs of the repository to load (empty: all)

    @property
    def has_static_workers(self) -> bool:
        return bool(self.workers or self.workers_file)

    def __post_init__(self) -> None:
        for name in ("http_port", "grpc_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        if self.model_control_mode not in ("none", "explicit", "poll"):
            raise ValueError(f"model control mode must be none, explicit or poll, got {self.model_control_mode!r}")
        if self.routing_policy not in ("prefix", "least_load", "round_robin", "session"):
            raise ValueError(f"unknown routing policy {self.routing_policy!r}")
        if self.max_running < 1 or self.max_queued < 0:
            raise ValueError("max_running must be >= 1 and max_queued >= 0")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis url must start with redis://, rediss:// or unix://, got {self.redis_url!r}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
