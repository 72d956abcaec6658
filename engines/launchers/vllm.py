"""The vLLM OpenAI server command line for a WorkerSpec.

It always turns on prefix caching, prompt-token details (so cached tokens are
reported) and ZMQ KV events with a replay socket, both bound to the worker's --host.
With `vllm-cpu` it adds fp32 and eager mode: on AVX2 CPUs bf16 is slow and graph
capture only costs start-up time. With a worker key, the child gets it as
$VLLM_API_KEY (never on its command line, which `ps` shows) and loads
`engines.launchers.worker_guard` through `--middleware`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engines.launchers import worker_guard
from engines.launchers.spec import WILDCARD_HOSTS, WorkerSpec
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


# vLLM's default max_num_seqs for its OpenAI server (vllm/engine/arg_utils.py, get_batch_defaults):
# 128 per rank on CPU; 256 on GPUs under 70 GiB (1024 on H100/H200/B200, which the launcher cannot
# tell before the engine starts: it states 256, and the gateway then under-admits, never over-admits).
CPU_MAX_NUM_SEQS_PER_RANK = 128
GPU_MAX_NUM_SEQS = 256


def engine_arg(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of `flag` in engine arguments (`--flag V` or `--flag=V`); the last one wins."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def schedules_by_priority(spec: WorkerSpec) -> bool:
    """Whether the vLLM engine `spec` starts orders its queue by request priority (the gateway then sends it)."""
    return spec.engine == "vllm" and engine_arg(spec.engine_args, "--scheduling-policy") == "priority"


def max_num_seqs(spec: WorkerSpec, cpu: bool) -> int:
    """The requests the vLLM engine `spec` starts will run at once: its --max-num-seqs, else vLLM's default."""
    given = engine_arg(spec.engine_args, "--max-num-seqs")
    if given is not None and given.isdigit() and int(given) > 0:
        return int(given)
    ranks = spec.tensor_parallel_size * spec.pipeline_parallel_size
    seqs = CPU_MAX_NUM_SEQS_PER_RANK * ranks if cpu else GPU_MAX_NUM_SEQS
    return seqs * 2 if engine_arg(spec.engine_args, "--performance-mode") == "throughput" else seqs


GUARD_MODULE = "sluice_worker_guard"  # the name worker_guard.py is copied under for the vLLM child


def bind_ipv4(host: str) -> str | None:
    """The IPv4 address `host` names (a literal, or a name resolved once); None for a wildcard.
    ValueError for IPv6: vLLM turns on no ZMQ IPv6, so its KV sockets could not bind it."""
    if host in WILDCARD_HOSTS:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            return socket.gethostbyname(host)
        except OSError as e:
            raise ValueError(f"--host {host!r} does not resolve to an IPv4 address: {e}") from None
    if address.version != 4:
        raise ValueError(f"--host {host}: vLLM's KV-event sockets cannot bind an IPv6 address; give an IPv4 one")
    return str(address)


def kv_bind_endpoints(host: str, port: int) -> tuple[str, str]:
    """The (PUB, replay) endpoints that make vLLM bind its KV-event sockets on `host` alone.

    vLLM binds the PUB socket only when its endpoint holds "*" or "::" and connects out
    otherwise; the replay socket always binds. So the PUB address is spelled IPv4-mapped,
    `[::ffff:a.b.c.d]`, which libzmq binds as the IPv4 address itself. A wildcard --host
    (asked for explicitly) gets wildcard KV sockets too."""
    ip = bind_ipv4(host)
    if ip is None:
        return f"tcp://*:{port}", f"tcp://*:{port + 1}"
    return f"tcp://[::ffff:{ip}]:{port}", f"tcp://{ip}:{port + 1}"


def kv_events_config(host: str, port: int) -> dict[str, object]:
    endpoint, replay = kv_bind_endpoints(host, port)
    return {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
            "endpoint": endpoint, "replay_endpoint": replay}


def install_guard(directory: Path) -> Path:
    """Copy the worker-key guard where the vLLM child imports it from; returns `directory`."""
    shutil.copyfile(worker_guard.__file__, directory / f"{GUARD_MODULE}.py")
    return directory


def build_vllm_launch(spec: WorkerSpec, python: str, cpu: bool, guard_dir: Path | None = None) -> VllmLaunch:
    """The argv and environment that start `spec` under `python`; with a worker key, `guard_dir`
    (see `install_guard`) goes on the child's PYTHONPATH."""
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
        argv += ["--kv-events-config", json.dumps(kv_events_config(spec.host, spec.kv_events_port))]
    env = dict(os.environ)
    if spec.worker_key is not None:
        if guard_dir is None:
            raise ValueError("a worker key needs the guard's directory (install_guard)")
        env[worker_guard.KEY_ENV] = spec.worker_key  # vLLM's --api-key and the guard both read it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(guard_dir), env.get("PYTHONPATH")) if p)
        argv += ["--middleware", f"{GUARD_MODULE}.WorkerKeyGuard"]
    argv += list(spec.engine_args)
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
