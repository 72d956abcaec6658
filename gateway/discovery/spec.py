"""`--k8s-discovery SPEC`: which EndpointSlices hold a gateway's workers, as one frozen dataclass.

SPEC is `key=value` options separated by commas, e.g.
`namespace=sluice,selector=app.kubernetes.io/component=vllm-worker,port=http,engine=vllm`,
or the same as a JSON object. A comma-separated item that does not start with a known
key continues the selector, so `selector=a=b,c=d` selects on both labels; selector
terms whose label key is itself an option name need the JSON form.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from engines.launchers.registration import WorkerEngine

_KEYS = ("namespace", "selector", "port", "engine", "tokenizer", "kubeconfig", "context", "drain_s")
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class DiscoverySpec:
    selector: str  # a label selector on EndpointSlices, e.g. app.kubernetes.io/component=vllm-worker
    namespace: str = "default"
    port: str = "http"  # the EndpointSlice port, by name or number
    engine: str = "vllm"  # the WorkerRecord engine of every worker found
    tokenizer: str | None = None  # for the gateway's own tokenization, when the model id is not a local path
    kubeconfig: str | None = None  # None: in-cluster config when in a pod, else $KUBECONFIG or ~/.kube/config
    context: str | None = None  # kubeconfig context
    drain_s: float = 30.0  # a leaving worker's in-flight requests get this long before it is removed

    def __post_init__(self) -> None:
        if not self.selector.strip():
            raise ValueError("--k8s-discovery: selector= is required (a label selector on EndpointSlices)")
        if not self.namespace:
            raise ValueError("--k8s-discovery: namespace= must not be empty")
        if self.engine not in get_args(WorkerEngine):
            raise ValueError(f"--k8s-discovery: engine= must be one of {', '.join(get_args(WorkerEngine))}, "
                             f"got {self.engine!r}")
        if self.port.isdigit() and not 0 < int(self.port) < 65536:
            raise ValueError(f"--k8s-discovery: port={self.port} is not a port number")
        if not 0 <= self.drain_s <= 3600:
            raise ValueError(f"--k8s-discovery: drain_s= must be within 0..3600 seconds, got {self.drain_s}")

    @property
    def label(self) -> str:
        """How logs name this source."""
        return f"{self.namespace}/{self.selector}"


def parse_discovery(value: str) -> DiscoverySpec:
    """Parse SPEC (see the module docstring); ValueError with a message for the user."""
    text = value.strip()
    options = _parse_json(text) if text.startswith("{") else _parse_pairs(text)
    unknown = set(options) - set(_KEYS)
    if unknown:
        raise ValueError(f"--k8s-discovery: unknown option(s) {', '.join(sorted(unknown))}; "
                         f"expected {', '.join(_KEYS)}")
    if "selector" not in options:
        raise ValueError("--k8s-discovery: selector= is required (a label selector on EndpointSlices)")
    namespace = options.pop("namespace", None) or _own_namespace()
    drain = options.pop("drain_s", None)
    try:
        drain_s = float(drain) if drain is not None else 30.0
    except ValueError:
        raise ValueError(f"--k8s-discovery: drain_s= must be a number, got {drain!r}") from None
    return DiscoverySpec(namespace=namespace, drain_s=drain_s, **options)


def require_client() -> None:
    """ValueError, at start-up rather than in a retry loop, when the official client is missing."""
    if importlib.util.find_spec("kubernetes") is None:
        raise ValueError("--k8s-discovery needs the `kubernetes` package (pip install 'sluice-gateway[k8s]')")


def _parse_json(text: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--k8s-discovery: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("--k8s-discovery: the JSON form must be an object")
    return {str(k): str(v) for k, v in data.items()}


def _parse_pairs(text: str) -> dict[str, str]:
    options: dict[str, str] = {}
    last: str | None = None
    for item in text.split(","):
        key, sep, val = item.partition("=")
        key = key.strip()
        if sep and key in _KEYS:
            options[key] = val.strip()
            last = key
        elif last == "selector":
            options["selector"] += "," + item.strip()
        else:
            raise ValueError(f"--k8s-discovery: expected KEY=VALUE with KEY one of {', '.join(_KEYS)}, "
                             f"got {item!r}")
    return options


def _own_namespace() -> str:
    """The pod's own namespace in a cluster, else `default`, as kubectl does."""
    try:
        return _SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"
