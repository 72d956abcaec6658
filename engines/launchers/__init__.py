"""`sluice worker --engine vllm|trtllm`: start an engine server with Sluice's settings.

API for the CLI: `add_worker_arguments(parser)` then `run_worker(args)` (args.engine
in {"vllm", "trtllm"}). `run_worker` blocks until the engine exits or we get
SIGTERM/SIGINT, and returns the exit code:
0 after a requested stop, the engine's code if it died, 1 if it never became
healthy. Registering with the gateway (`--gateway`) is retried for as long as the engine
lives; it never stops the engine (`registration.Keeper`).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import tempfile
from pathlib import Path

import httpx

from engines.launchers import registration, trtllm, vllm
from engines.launchers.process import EngineProcess, StopSignal
from engines.launchers.spec import (
    ENGINES,
    WorkerEnvironment,
    WorkerSpec,
    add_worker_arguments,
    spec_from_args,
    warn_exposure,
    worker_key_from_args,
)

log = logging.getLogger(__name__)

__all__ = ["ENGINES", "WorkerEnvironment", "WorkerSpec", "add_worker_arguments", "run_worker", "spec_from_args",
           "worker_key_from_args"]

_BLOCK_SIZE_RE = re.compile(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"')


def run_worker(args: argparse.Namespace) -> int:
    """Launch, supervise and (with --gateway) register one worker; see the module docstring."""
    spec = spec_from_args(args, WorkerEnvironment.from_environ())
    # trtllm-serve does not check the worker key: such a worker is open to whoever reaches its port.
    warn_exposure(spec.host, spec.worker_key is not None and spec.engine != "trtllm", f"worker {spec.worker_name}")
    with tempfile.TemporaryDirectory(prefix="sluice-worker-") as scratch, StopSignal() as stop:
        proc, capacity = _spawn(spec, Path(scratch))
        if not proc.wait_healthy(f"{spec.url}/health", spec.startup_timeout_s, stop.event):
            code = proc.poll()
            log.error("worker %s did not become healthy (exit code %s)", spec.worker_name, code)
            proc.stop(spec.stop_timeout_s)
            return 0 if stop.event.is_set() else (code or 1)
        log.info("worker %s serving %s at %s", spec.worker_name, spec.served_model_name, spec.url)
        # Registration runs beside the engine and never stops it: a gateway that is down or refuses
        # the record is retried with back-off (and logged), while the engine goes on serving.
        source = registration.registration_source(spec.host, spec.public_host)
        keeper = registration.Keeper(spec.gateway, _record(spec, capacity), spec.registration_key,
                                     check_s=spec.registration_check_s, source=source).start() if spec.gateway else None
        try:
            while proc.poll() is None and not stop.event.wait(1.0):
                pass
        finally:
            if keeper is not None:
                keeper.stop()
        died = proc.poll()
        proc.stop(spec.stop_timeout_s)
        if died is not None:
            log.error("engine exited on its own with code %d", died)
            return died or 1
        return 0


def _spawn(spec: WorkerSpec, scratch: Path) -> tuple[EngineProcess, int]:
    """The engine process, and the requests it runs at once (the record's `capacity`)."""
    if spec.engine == "vllm":
        python = vllm.resolve_python(spec.python)
        guard = vllm.install_guard(scratch) if spec.worker_key is not None else None
        cpu = vllm.is_cpu_build(python)
        launch = vllm.build_vllm_launch(spec, python, cpu=cpu, guard_dir=guard)
        return EngineProcess(launch.argv, launch.env), vllm.max_num_seqs(spec, cpu)
    options = trtllm.write_options(spec, scratch)
    env = None
    if spec.worker_key is not None:
        # Real trtllm-serve does not check it; a $SLUICE_TRTLLM_SERVE wrapper (and the stand-in) may.
        log.warning("trtllm-serve does not check the worker key (it only gets $SLUICE_WORKER_KEY): keep its "
                    "port reachable by the gateway alone (a NetworkPolicy)")
        env = dict(os.environ, SLUICE_WORKER_KEY=spec.worker_key)
    return EngineProcess(trtllm.build_trtllm_argv(spec, options), env), trtllm.max_batch_size(spec)


def _record(spec: WorkerSpec, capacity: int | None = None) -> registration.WorkerRecord:
    if spec.engine == "vllm":
        events, replay = vllm.kv_endpoints(spec)
        block_size = _vllm_block_size(spec.url)
    else:
        events, replay = trtllm.kv_endpoints(spec)
        block_size = trtllm.DEFAULT_TOKENS_PER_BLOCK
    return registration.WorkerRecord(name=spec.worker_name, url=spec.url, models=(spec.served_model_name,),
                                     engine=spec.engine, block_size=block_size, kv_events_endpoint=events,
                                     kv_events_replay_endpoint=replay, tokenizer=spec.model_path,
                                     capacity=capacity, priority_scheduling=vllm.schedules_by_priority(spec))


def _vllm_block_size(url: str) -> int | None:
    """The KV block size vLLM reports (128 on CPU, 16 by default on GPU)."""
    try:
        match = _BLOCK_SIZE_RE.search(httpx.get(f"{url}/metrics", timeout=10.0).text)
    except httpx.HTTPError:
        return None
    return int(match.group(1)) if match else None
