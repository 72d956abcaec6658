"""The `trtllm-serve` command line and LLM API options YAML for a WorkerSpec.

NOT run against a real TensorRT-LLM engine here (it needs an NVIDIA GPU); tested
against tests/standins/trtllm_standin.py, which reproduces trtllm-serve's HTTP shapes.
Multi-node: wrap the same command in `mpirun -n <world> trtllm-llmapi-launch ...`
(docs/workers.md).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from engines.launchers.spec import WorkerSpec

# trtllm-serve's default tokens_per_block; the router hashes blocks of this size.
DEFAULT_TOKENS_PER_BLOCK = 32
DEFAULT_EVENT_BUFFER = 1024  # KV events kept until /kv_cache_events drains them
DEFAULT_MAX_BATCH_SIZE = 256  # trtllm-serve's --max_batch_size default (its docs)


def max_batch_size(spec: WorkerSpec) -> int:
    """The requests the engine runs at once: --max_batch_size among the engine arguments, else the default."""
    from engines.launchers.vllm import engine_arg

    given = engine_arg(spec.engine_args, "--max_batch_size")
    return int(given) if given is not None and given.isdigit() and int(given) > 0 else DEFAULT_MAX_BATCH_SIZE


def llm_api_options(spec: WorkerSpec, event_buffer_max_size: int = DEFAULT_EVENT_BUFFER) -> dict[str, Any]:
    """The YAML options: block reuse (prefix caching) and a KV event buffer."""
    if event_buffer_max_size <= 0:
        raise ValueError("event_buffer_max_size must be > 0, or /kv_cache_events stays empty")
    return {"kv_cache_config": {"enable_block_reuse": True, "event_buffer_max_size": event_buffer_max_size},
            # Per-iteration stats feed /metrics, which the router reads for load.
            "enable_iter_perf_stats": True}


def write_options(spec: WorkerSpec, directory: Path) -> Path:
    path = directory / f"trtllm-{spec.worker_name}.yaml"
    path.write_text(yaml.safe_dump(llm_api_options(spec), sort_keys=True))
    return path


def serve_command(override: str | None) -> list[str]:
    """`trtllm-serve`, or the override, $SLUICE_TRTLLM_SERVE (a shell-quoted command, e.g. a container wrapper)."""
    return shlex.split(override) if override else ["trtllm-serve"]


def build_trtllm_argv(spec: WorkerSpec, options_path: Path) -> list[str]:
    argv = [*serve_command(spec.trtllm_serve), spec.model_path, "--host", spec.host, "--port", str(spec.port),
            "--backend", "pytorch", "--tp_size", str(spec.tensor_parallel_size),
            "--pp_size", str(spec.pipeline_parallel_size),
            "--extra_llm_api_options", str(options_path)]
    if spec.max_model_len is not None:
        argv += ["--max_seq_len", str(spec.max_model_len)]
    return argv + list(spec.engine_args)


def kv_endpoints(spec: WorkerSpec) -> tuple[str | None, str | None]:
    """trtllm-serve has no push socket: the gateway polls POST {url}/kv_cache_events."""
    return f"{spec.url}/kv_cache_events", None
