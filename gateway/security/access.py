"""Which credential a route needs, who the peer is, and where the caller's key id travels.

One table per protocol says what each path or RPC needs: nothing (health probes),
an API key (inference and everything else: unknown paths are not open), an admin
key (repository load/unload, worker administration) or, for `/metrics`, any key
when `--metrics-require-key` is set. The edges (`gateway.security.http`,
`gateway.security.grpc`) authenticate by this table before a route runs.
"""

from __future__ import annotations

import ipaddress
import re
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from starlette.requests import Request

from engines.errors import ErrorKind, SluiceError


class Access(StrEnum):
    OPEN = "open"
    API = "api"
    ADMIN = "admin"
    METRICS = "metrics"


# Probes, and /version (as vLLM serves it): Kubernetes' liveness probe uses it, and it tells nothing secret.
_OPEN_PATHS = frozenset({"/health", "/version", "/v2/health/live", "/v2/health/ready"})
_ADMIN_PATH = re.compile(r"^/v1/admin(/|$)|^/v2/repository/models/[^/]+/(load|unload)/?$")
_SERVICE = "/inference.GRPCInferenceService/"
_OPEN_RPCS = frozenset({"ServerLive", "ServerReady"})
_ADMIN_RPCS = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})
# A request carrying any of these came through a proxy, whatever its socket peer is.
FORWARDING_HEADERS = frozenset({"forwarded", "x-forwarded-for", "x-real-ip"})

# Set by the edges for the request being served: the scope key (HTTP) and the
# context variable (gRPC, where handlers only see the servicer context).
SCOPE_KEY_ID = "sluice.key_id"
SCOPE_ACCESS = "sluice.access"
current_key_id: ContextVar[str | None] = ContextVar("sluice_key_id", default=None)


def classify_path(path: str) -> Access:
    # The browser page and its static assets: a browser cannot send a bearer key when it loads
    # a page, so the page itself is open and asks for the key it then sends with every call.
    if path in _OPEN_PATHS or path == "/" or path.startswith("/ui/"):
        return Access.OPEN
    if path == "/metrics":
        return Access.METRICS
    if _ADMIN_PATH.match(path):
        return Access.ADMIN
    return Access.API


def classify_rpc(method: str) -> Access:
    """`method` is the full name gRPC gives, e.g. `/inference.GRPCInferenceService/ModelInfer`."""
    name = method[len(_SERVICE):] if method.startswith(_SERVICE) else ""
    if name in _OPEN_RPCS:
        return Access.OPEN
    if name in _ADMIN_RPCS:
        return Access.ADMIN
    return Access.API


def bearer(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` value."""
    scheme, _, token = (value or "").strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def is_local(host: str | None, header_names: set[str]) -> bool:
    """A direct loopback peer. A request with forwarding headers came through a proxy,
    so it is not local even from 127.0.0.1, whether or not that proxy is trusted."""
    return is_loopback(host) and not (header_names & FORWARDING_HEADERS)


def grpc_peer_host(peer: str) -> str | None:
    """The address of a grpc peer string: `ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


def key_id_of(request: Any) -> str | None:
    """The key id the HTTP edge authenticated this request as (None on open routes)."""
    value = request.scope.get(SCOPE_KEY_ID)
    return value if isinstance(value, str) else None


def require_admin(request: Request) -> None:
    """Route dependency for admin routes: fails closed when the edge did not authorise
    the request as admin (a route whose path the access table does not list as admin)."""
    if request.scope.get(SCOPE_ACCESS) != Access.ADMIN.value:
        raise SluiceError("this route needs an admin key", ErrorKind.PERMISSION_DENIED)
