"""The classic (Triton-compatible) path: model repository, dynamic batcher, backends, ensembles.

`ModelRepositoryManager` is the entry point; see its module docstring for the API.
"""

from __future__ import annotations

from engines.classic.errors import ConfigError, InferError
from engines.classic.manager import ModelRepositoryManager
from engines.classic.stats import StatsSnapshot

__all__ = ["ConfigError", "InferError", "ModelRepositoryManager", "StatsSnapshot"]
