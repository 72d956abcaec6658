"""EndpointSlices (`discovery.k8s.io/v1`, wire format) to worker endpoints: pure, no I/O.

A Service's endpoints may be split over several slices, and during an update one
pod may appear in two; an endpoint is ready when any slice says so. Readiness
follows the API's own rule: `conditions.ready` unset means ready, and an endpoint
that is terminating is leaving whatever `ready` says (with `publishNotReadyAddresses`
a terminating pod can still be marked ready).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_NAME_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # the worker name: the pod's name, stable across the pod's IP changes
    url: str  # http://<address>:<port>
    ready: bool


def endpoints_of(obj: Mapping[str, Any], port: str) -> list[Endpoint]:
    """The endpoints of one slice on `port` (a port name, or a number); none if the slice lacks it."""
    number = _port_number(obj.get("ports") or [], port)
    if number is None or obj.get("addressType") not in ("IPv4", "IPv6", "FQDN"):
        return []
    out = []
    for ep in obj.get("endpoints") or []:
        addresses = ep.get("addresses") or []
        if not addresses:
            continue
        host = f"[{addresses[0]}]" if obj["addressType"] == "IPv6" else addresses[0]
        cond = ep.get("conditions") or {}
        ready = cond.get("ready") is not False and cond.get("terminating") is not True
        out.append(Endpoint(_endpoint_name(obj, ep, addresses[0]), f"http://{host}:{number}", ready))
    return out


def ready_workers(slices: Iterable[Mapping[str, Any]], port: str) -> dict[str, str]:
    """Worker name -> URL for every endpoint some slice marks ready."""
    out: dict[str, str] = {}
    for obj in slices:
        for ep in endpoints_of(obj, port):
            if ep.ready:
                out[ep.name] = ep.url
    return out


def _port_number(ports: list[Mapping[str, Any]], port: str) -> int | None:
    for p in ports:
        number = p.get("port")
        if not isinstance(number, int):
            continue
        if (p.get("name") or "") == port or (port.isdigit() and number == int(port)):
            return number
    return None


def _endpoint_name(obj: Mapping[str, Any], ep: Mapping[str, Any], address: str) -> str:
    ref = ep.get("targetRef") or {}
    if ref.get("kind") == "Pod" and ref.get("name"):
        return str(ref["name"])
    if ep.get("hostname"):
        return str(ep["hostname"])
    service = (obj.get("metadata") or {}).get("labels", {}).get("kubernetes.io/service-name", "endpoint")
    return _NAME_CHARS.sub("-", f"{service}-{address}")[:128]


class SliceCache:
    """What a list + watch of EndpointSlices says now, keyed by slice name; not thread-safe.

    `replace` takes a list response, `apply` one watch event; both keep
    `resource_version`, the version to resume watching from."""

    def __init__(self) -> None:
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None

    def replace(self, items: Iterable[Mapping[str, Any]], resource_version: str | None) -> None:
        self.slices = {_name(obj): obj for obj in items}
        self.resource_version = resource_version

    def apply(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Apply one ADDED / MODIFIED / DELETED / BOOKMARK event; True if the slices changed.
        ValueError for any other type (ERROR events are the watcher's to handle)."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return False
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise ValueError(f"unexpected watch event type {kind!r}")
        name = _name(obj)
        if kind == "DELETED":
            changed = self.slices.pop(name, None) is not None
        else:
            changed = self.slices.get(name) != obj
            self.slices[name] = obj
        self.resource_version = version or self.resource_version
        return changed


def _name(obj: Mapping[str, Any]) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise ValueError("an EndpointSlice without metadata.name")
    return str(name)
