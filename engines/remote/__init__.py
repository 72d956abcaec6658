"""Remote LLM workers (vLLM, trtllm-serve, any OpenAI-compatible server) behind LLMEngine."""

from __future__ import annotations

from engines.remote.client import RemoteEngine, RemoteEngineConfig
from engines.remote.errors import normalize_error
from engines.remote.payload import build_body

__all__ = ["RemoteEngine", "RemoteEngineConfig", "build_body", "normalize_error"]
