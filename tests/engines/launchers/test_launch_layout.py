"""`sluice launch` layout checks: what is accepted, what is refused and why (engines/launchers/layout.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines.errors import ErrorKind
from engines.launchers.layout import Layout, LayoutError, check_model, layout_from
from engines.launchers.vllm import cpu_thread_binding
from tests.servers import ROOT


@pytest.mark.parametrize(("engine", "tp", "pp", "nodes", "gpus"), [
    ("vllm", 8, 2, 2, 8),  # the usual: TP inside a node, one pipeline stage per node
    ("trtllm", 8, 2, 2, 8),
    ("vllm", 4, 4, 2, 8),  # two pipeline stages per node
    ("vllm", 16, 1, 2, 8),  # TP across two whole nodes
    ("trtllm", 16, 2, 4, 8),
    ("vllm", 2, 1, 1, 2),  # one node
])
def test_sound_layouts_are_accepted(engine: str, tp: int, pp: int, nodes: int, gpus: int) -> None:
    layout = Layout(engine, tp, pp, nodes, gpus)  # type: ignore[arg-type]
    assert layout.world_size == nodes * gpus
    assert layout.cross_node_tp == (tp > gpus)
    assert bool(layout.warnings()) == (tp > gpus)


@pytest.mark.parametrize(("tp", "pp", "nodes", "gpus", "constraint"), [
    (8, 2, 2, 4, "TP × PP must equal nodes × GPUs per node: 8 × 2 = 16 ranks, but 2 × 4 = 8 GPUs"),
    (4, 1, 2, 8, "TP × PP must equal nodes × GPUs per node"),  # idle GPUs are a mistake too
    (3, 2, 3, 2, "TP 3 neither divides nor is a multiple of 2 GPUs per node"),
    (6, 2, 3, 4, "TP 6 neither divides nor is a multiple of 4 GPUs per node"),
    (0, 1, 1, 1, "--tp must be >= 1"),
    (1, 0, 1, 1, "--pp must be >= 1"),
    (1, 1, 0, 1, "--nodes must be >= 1"),
    (1, 1, 1, 0, "--gpus-per-node must be >= 1"),
])
def test_impossible_layouts_are_refused_naming_the_constraint(tp: int, pp: int, nodes: int, gpus: int,
                                                              constraint: str) -> None:
    with pytest.raises(LayoutError) as err:
        Layout("vllm", tp, pp, nodes, gpus)
    assert constraint in err.value.message
    assert err.value.kind is ErrorKind.INVALID_ARG


def test_gpus_per_node_defaults_to_an_even_share() -> None:
    assert layout_from("vllm", 8, 2, 2, None).gpus_per_node == 8
    with pytest.raises(LayoutError, match="cannot be split evenly over 3 nodes"):
        layout_from("vllm", 8, 1, 3, None)


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(LayoutError, match="--engine must be one of vllm, trtllm"):
        Layout("sglang", 1, 1, 1, 1)  # type: ignore[arg-type]


def test_a_local_model_is_checked_against_the_layout(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4, "num_hidden_layers": 2}))
    check_model(Layout("vllm", 2, 2, 1, 4), str(tmp_path))
    with pytest.raises(LayoutError, match="4 attention heads are not divisible by TP 8"):
        check_model(Layout("vllm", 8, 1, 1, 8), str(tmp_path))
    with pytest.raises(LayoutError, match="PP 4 is more pipeline stages than the model's 2 layers"):
        check_model(Layout("vllm", 1, 4, 4, 1), str(tmp_path))
    check_model(Layout("vllm", 8, 1, 1, 8), "meta-llama/Llama-3.1-8B")  # a hub id: left to the engine


@pytest.mark.parametrize("argv", [
    ["--engine", "vllm", "--model", "/m", "--tp", "8", "--pp", "2", "--nodes", "2", "--gpus-per-node", "4"],
    ["--engine", "trtllm", "--model", "/m", "--tp", "3", "--pp", "2", "--nodes", "3", "--gpus-per-node", "2"],
    ["--engine", "vllm", "--model", "/m", "--tp", "2", "--nodes", "1", "--name", "Not_A_DNS_Label"],
])
def test_the_cli_refuses_with_exit_code_2_and_writes_nothing(argv: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "launch", *argv, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("sluice launch: ") and "Traceback" not in proc.stderr
    assert not out.exists()


def test_cpu_ranks_share_the_cores_explicitly() -> None:
    assert cpu_thread_binding([0, 1], 2) == "0|1"
    assert cpu_thread_binding(list(range(8)), 2) == "0,1,2,3|4,5,6,7"
    with pytest.raises(ValueError, match="2 vLLM CPU ranks"):
        cpu_thread_binding([0], 2)
