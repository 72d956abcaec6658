"""How a multi-node launch lays tensor- and pipeline-parallel ranks over nodes: checked, never guessed.

A layout is `tp` × `pp` ranks, one per GPU, on `nodes` nodes of `gpus_per_node` GPUs.
Both engines rank GPUs node by node, tensor-parallel groups innermost, so a layout
is sound when every GPU gets exactly one rank and no tensor-parallel group is cut
across a node boundary unevenly:

- `tp * pp == nodes * gpus_per_node` (idle or oversubscribed GPUs are a mistake);
- `tp` divides `gpus_per_node` (each TP group inside one node; nodes hold whole
  pipeline stages), or `gpus_per_node` divides `tp` (a TP group spans whole nodes).

Cross-node tensor parallelism (`tp > gpus_per_node`) is allowed for both engines,
with a warning: vLLM runs it on its Ray executor and TensorRT-LLM on its MPI world
(each only needs the TP group to cover whole nodes), but every layer's all-reduce
then crosses the network, which is only fast on RDMA (InfiniBand/RoCE). The usual
layout, and the one both engines' documentation recommends, is `tp = gpus_per_node`,
`pp = nodes`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engines.errors import ErrorKind, SluiceError

LaunchEngine = Literal["vllm", "trtllm"]
LAUNCH_ENGINES: tuple[LaunchEngine, ...] = ("vllm", "trtllm")
MAX_RANKS = 4096  # far beyond any real deployment; bounds the generated files


class LayoutError(SluiceError):
    """An impossible or unsound layout; the message names the constraint."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, ErrorKind.INVALID_ARG, param=param)


@dataclass(frozen=True, slots=True)
class Layout:
    engine: LaunchEngine
    tp: int
    pp: int
    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.engine not in LAUNCH_ENGINES:
            raise LayoutError(f"--engine must be one of {', '.join(LAUNCH_ENGINES)}, got {self.engine!r}", "engine")
        for flag, value in (("--tp", self.tp), ("--pp", self.pp), ("--nodes", self.nodes),
                            ("--gpus-per-node", self.gpus_per_node)):
            if value < 1:
                raise LayoutError(f"{flag} must be >= 1, got {value}", flag)
        if self.world_size > MAX_RANKS:
            raise LayoutError(f"TP × PP = {self.world_size} ranks is more than {MAX_RANKS}", "--tp")
        gpus = self.nodes * self.gpus_per_node
        if self.world_size != gpus:
            raise LayoutError(
                f"TP × PP must equal nodes × GPUs per node: {self.tp} × {self.pp} = {self.world_size} ranks, "
                f"but {self.nodes} × {self.gpus_per_node} = {gpus} GPUs", "--tp")
        if self.gpus_per_node % self.tp and self.tp % self.gpus_per_node:
            raise LayoutError(
                f"a tensor-parallel group must fit inside one node or span whole nodes: TP {self.tp} neither "
                f"divides nor is a multiple of {self.gpus_per_node} GPUs per node", "--tp")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def cross_node_tp(self) -> bool:
        return self.tp > self.gpus_per_node

    def warnings(self) -> list[str]:
        out = []
        if self.cross_node_tp:
            out.append(f"TP {self.tp} spans {self.tp // self.gpus_per_node} nodes: every layer's all-reduce "
                       "crosses the network (fast only on RDMA); TP = GPUs per node with PP = nodes is the usual "
                       "layout")
        return out


def layout_from(engine: LaunchEngine, tp: int, pp: int, nodes: int, gpus_per_node: int | None) -> Layout:
    """The layout; without `gpus_per_node`, every node holds the same share of the ranks."""
    if gpus_per_node is None:
        if nodes < 1:
            raise LayoutError(f"--nodes must be >= 1, got {nodes}", "--nodes")
        if (tp * pp) % nodes:
            raise LayoutError(f"TP × PP = {tp * pp} ranks cannot be split evenly over {nodes} nodes; "
                              "give --gpus-per-node", "--nodes")
        gpus_per_node = tp * pp // nodes
    return Layout(engine, tp, pp, nodes, gpus_per_node)


def check_model(layout: Layout, model: str) -> None:
    """When `model` is a local directory with a config.json, check the layout against the model:
    attention heads divisible by TP, at least PP layers. Remote ids are left to the engine."""
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        return
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise LayoutError(f"cannot read {config_path}: {exc}", "--model") from None
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    heads, layers = config.get("num_attention_heads"), config.get("num_hidden_layers")
    if isinstance(heads, int) and heads % layout.tp:
        raise LayoutError(f"the model's {heads} attention heads are not divisible by TP {layout.tp}", "--tp")
    if isinstance(layers, int) and layers < layout.pp:
        raise LayoutError(f"PP {layout.pp} is more pipeline stages than the model's {layers} layers", "--pp")
