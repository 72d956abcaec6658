"""A multi-node launch: the layout plus what every node needs to know, as one frozen dataclass.

`sluice launch` turns a `LaunchPlan` into one shell script per node role
(`scripts.py`) and a LeaderWorkerSet manifest (`lws.py`). The leader (node 0) runs
the engine under `sluice worker ... --gateway`, so a multi-node worker registers with
the same WorkerRecord as a single-node one; the other nodes only join the engine's
runtime (a Ray cluster for vLLM, an MPI world over SSH for TensorRT-LLM).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from engines.launchers.layout import Layout, LayoutError

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
WORKER_PORT = 8100  # the worker's HTTP port, as for `sluice worker`
RAY_PORT = 6379  # Ray's GCS port on the head
SSH_PORT = 2222  # sshd on TensorRT-LLM worker nodes (not 22: no capability to bind a low port)
NODE_WAIT_S = 1800  # how long the leader waits for the other nodes (image pulls, model downloads)
DEFAULT_STARTUP_TIMEOUT_S = 1800  # `sluice worker --startup-timeout-s` on the leader: loading weights
# The label the gateway's Kubernetes discovery selects the leaders' EndpointSlices by.
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    layout: Layout
    model: str  # path (or hub id) every node can load
    served_model_name: str
    name: str  # the LeaderWorkerSet's name; a DNS label
    image: str
    gateway: str | None = "http://sluice-gateway:8000"  # None: the leader does not register
    max_model_len: int | None = None
    engine_args: tuple[str, ...] = ()  # passed to the engine verbatim
    command_line: str = ""  # how the files were generated, for their headers
    # After the other nodes joined, how long the engine may take to become healthy; the leader's
    # start-up probe allows NODE_WAIT_S plus this (and a minute), so neither cuts the other short.
    startup_timeout_s: int = DEFAULT_STARTUP_TIMEOUT_S
    # Per GPU of a node: what the pod requests (and, memory, its limit) so it is never BestEffort.
    # Weights pass through host memory while loading, and /dev/shm counts against the limit.
    cpu_per_gpu: int = 6
    memory_gib_per_gpu: int = 32

    def __post_init__(self) -> None:
        # The LWS name prefixes pod names "<name>-<group>-<index>": keep room for the suffixes.
        if len(self.name) > 40 or not _DNS_LABEL.match(self.name):
            raise LayoutError(f"--name {self.name!r} must be a DNS label (a-z, 0-9, '-') of at most 40 characters",
                              "--name")
        if not self.model or not self.served_model_name:
            raise LayoutError("--model and --served-model-name must not be empty", "--model")
        if self.gateway is not None and not self.gateway.startswith(("http://", "https://")):
            raise LayoutError(f"--gateway must be an http(s) URL, got {self.gateway!r}", "--gateway")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise LayoutError(f"--max-model-len must be >= 1, got {self.max_model_len}", "--max-model-len")
        for flag, value in (("--startup-timeout-s", self.startup_timeout_s), ("--cpu-per-gpu", self.cpu_per_gpu),
                            ("--memory-gib-per-gpu", self.memory_gib_per_gpu)):
            if value < 1:
                raise LayoutError(f"{flag} must be >= 1, got {value}", flag)

    @property
    def engine(self) -> str:
        return self.layout.engine

    @property
    def component(self) -> str:
        """The value of COMPONENT_LABEL on the leaders' Service (and so on its EndpointSlices)."""
        return f"{self.engine}-worker"


def default_name(engine: str, model: str) -> str:
    """`vllm-llama-3-1-70b-instruct` from `/models/Llama-3.1-70B-Instruct`."""
    base = re.sub(r"[^a-z0-9]+", "-", PurePath(model.rstrip("/")).name.lower()).strip("-")
    return f"{engine}-{base}"[:40].rstrip("-") or engine
