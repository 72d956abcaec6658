"""The classic path's resource bounds, in one frozen object, and the checks that apply them.

`ClassicLimits` is built once from the server settings and handed to the manager;
every model version reads its bounds from it unless its config.pbtxt sets its own
(`dynamic_batching.default_queue_policy.max_queue_size`, the `execute_timeout_s`
parameter). The checks are pure and raise InferError(INVALID_ARG) for a request
outside a bound, before anything is allocated for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from engines.classic.errors import ConfigError, invalid
from engines.classic.proto import ModelConfig

# A request's `timeout` (µs) above this is a client mistake, not a deadline: one hour.
MAX_TIMEOUT_US = 3600 * 1_000_000
EXECUTE_TIMEOUT_PARAM = "execute_timeout_s"
ISOLATION_PARAM = "isolation"
ISOLATION_MODES = ("none", "process")


@dataclass(frozen=True, slots=True)
class ClassicLimits:
    # Queued requests per priority level of a model whose config sets no max_queue_size.
    max_queue_size: int = 1024
    # Elements of one input tensor (product of its shape); larger shapes are refused unread.
    max_tensor_elements: int = 64 * 1024 * 1024
    # Seconds one execute() may run unless the model's config says otherwise; 0: no limit.
    execute_timeout_s: float = 300.0
    # Not a bound, but handed to every model version the same way: with a user, every python model runs
    # in its own process as that user (--python-model-user; checked at start-up by the settings).
    python_model_user: str | None = None
    # Triton's rate limiter (--rate-limit execution_count) and what the server has of each resource.
    rate_limit: bool = False
    rate_limit_resources: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if self.max_tensor_elements < 1:
            raise ValueError(f"max_tensor_elements must be >= 1, got {self.max_tensor_elements}")
        if not 0 <= self.execute_timeout_s < math.inf:
            raise ValueError(f"execute_timeout_s must be >= 0 and finite, got {self.execute_timeout_s}")


MAX_DIMS = 64
MAX_DIM = 2**63 - 1  # numpy's intp


def element_count(name: str, shape: Sequence[int], max_elements: int) -> int:
    """The element count of `shape`, computed without overflow; raises for a negative dim, too many
    dims (numpy holds at most 64) or too many elements."""
    if len(shape) > MAX_DIMS:
        raise invalid(f"input '{name}': shape has {len(shape)} dimensions, at most {MAX_DIMS} are supported")
    if any(d < 0 for d in shape):
        raise invalid(f"input '{name}': shape {list(shape)} has a negative dimension")
    count = math.prod(shape)  # Python ints: [2**40, 2**40] is 2**80, not a wrapped int64
    if count > max_elements:
        raise invalid(f"input '{name}': shape {list(shape)} has {count} elements, more than the "
                      f"{max_elements} allowed per tensor")
    # numpy sizes an array in int64 bytes counting every non-zero dimension, even when another is 0:
    # such a shape (e.g. [0, 2**63]) describes no array at all.
    if math.prod(d for d in shape if d) > MAX_DIM // 8:
        raise invalid(f"input '{name}': shape {list(shape)} has more elements than a tensor can hold")
    return count


def check_timeout(timeout_us: int) -> None:
    if not 0 <= timeout_us <= MAX_TIMEOUT_US:
        raise invalid(f"parameter 'timeout' must be in [0, {MAX_TIMEOUT_US}] microseconds, got {timeout_us}")


def priority_levels(config: ModelConfig) -> int:
    """The model's priority levels; a model without them has one (priority 0 or 1)."""
    return max(1, config.dynamic_batching.priority_levels) if config.HasField("dynamic_batching") else 1


def check_priority(config: ModelConfig, priority: int) -> None:
    levels = priority_levels(config)
    if not 0 <= priority <= levels:
        raise invalid(f"parameter 'priority' must be in [0, {levels}] for model '{config.name}' "
                      f"(0: the default level), got {priority}")


def _param(config: ModelConfig, key: str) -> str | None:
    return config.parameters[key].string_value if key in config.parameters else None


def execute_timeout_s(config: ModelConfig, limits: ClassicLimits, source: str) -> float:
    """The model's execute time limit: its `execute_timeout_s` parameter, else the server's; 0: none."""
    raw = _param(config, EXECUTE_TIMEOUT_PARAM)
    if raw is None:
        return limits.execute_timeout_s
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < math.inf:
        raise ConfigError(f"{source}: field 'parameters.{EXECUTE_TIMEOUT_PARAM}': must be a number of seconds "
                          f">= 0 (0: no limit), got '{raw}'")
    return value


def isolation(config: ModelConfig, source: str, model_user: str | None = None) -> str:
    """'process' when the model asks to run each instance in its own process, or is a python model and the
    server runs python models as `model_user`; else 'none'."""
    mode = _param(config, ISOLATION_PARAM) or "none"
    if mode not in ISOLATION_MODES:
        raise ConfigError(f"{source}: field 'parameters.{ISOLATION_PARAM}': must be one of "
                          f"{list(ISOLATION_MODES)}, got '{mode}'")
    if model_user is not None and config.backend == "python":
        if _param(config, ISOLATION_PARAM) == "none":
            raise ConfigError(f"{source}: field 'parameters.{ISOLATION_PARAM}': 'none' is refused while "
                              f"--python-model-user is set: python models run in their own process, as that user")
        return "process"
    if mode == "process" and config.backend != "python":
        raise ConfigError(f"{source}: field 'parameters.{ISOLATION_PARAM}': process isolation applies to "
                          f"python models only, not backend '{config.backend}'")
    return mode


def check_parameters(config: ModelConfig, source: str) -> None:
    """The Sluice parameters of a config.pbtxt, checked when the config is read."""
    execute_timeout_s(config, ClassicLimits(), source)
    isolation(config, source)
