"""Which credential a route needs, who the peer is, and where the caller's key id travels.

One table per protocol says what each path or RPC needs: nothing (health probes),
an API key (inference and everything else: unknown paths are not open), an admin
key holding the route's scope (`repository`: repository load/unload and the other
`/v1/admin` routes; `workers`: `/v1/admin/workers...`, which the registration key
opens too) or, for `/metrics` with `--metrics-require-key`, a key holding the
`metrics` scope. The edges (`gateway.security.http`, `gateway.security.grpc`)
authenticate by this table before a route runs.
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
    """What a route needs. Past OPEN and API, the value is also the admin-key scope that opens it."""

    OPEN = "open"
    API = "api"
    REPOSITORY = "repository"  # model repository control
    WORKERS = "workers"  # worker registration and administration
    METRICS = "metrics"  # /metrics, when --metrics-require-key


ADMIN = frozenset({Access.REPOSITORY, Access.WORKERS})  # the admin routes (loopback rules apply to them)


# Probes, and /version (as vLLM serves it): Kubernetes' liveness probe uses it, and it tells nothing secret.
_OPEN_PATHS = frozenset({"/health", "/version", "/v2/health/live", "/v2/health/ready"})
_WORKERS_PATH = re.compile(r"^/v1/admin/workers(/|$)")
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
SCOPE_ADMIN_SCOPES = "sluice.admin_scopes"  # on admin routes: the scopes the admin principal holds
current_key_id: ContextVar[str | None] = ContextVar("sluice_key_id", default=None)


def classify_path(path: str) -> Access:
    # The browser page and its static assets: a browser cannot send a bearer key when it loads
    # a page, so the page itself is open and asks for the key it then sends with every call.
    if path in _OPEN_PATHS or path == "/" or path.startswith("/ui/"):
        return Access.OPEN
    if path == "/metrics":
        return Access.METRICS
    if _WORKERS_PATH.match(path):
        return Access.WORKERS
    if _ADMIN_PATH.match(path):
        return Access.REPOSITORY
    return Access.API


def classify_rpc(method: str) -> Access:
    """`method` is the full name gRPC gives, e.g. `/inference.GRPCInferenceService/ModelInfer`."""
    name = method[len(_SERVICE):] if method.startswith(_SERVICE) else ""
    if name in _OPEN_RPCS:
        return Access.OPEN
    if name in _ADMIN_RPCS:
        return Access.REPOSITORY
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


def is_loopback_authority(value: str) -> bool:
    """A `Host` header naming this machine's loopback: localhost, 127.0.0.0/8 or [::1], any port."""
    host = value.strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host in ("localhost", "localhost.") or is_loopback(host)


def browser_refusal(origin: str | None, host: str | None) -> str | None:
    """Why a keyless loopback admin request may come from a browser page (None: it cannot).
    A page on this machine can reach 127.0.0.1: it sends `Origin` (CSRF), or a rebound DNS
    name of its own as `Host` (DNS rebinding). A client without a browser sends neither."""
    if origin is not None:
        return "Admin routes without an admin key refuse requests with an Origin header (browser pages)."
    if host is not None and not is_loopback_authority(host):
        return "Admin routes without an admin key answer only requests whose Host is a loopback address."
    return None


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
    if request.scope.get(SCOPE_ACCESS) not in (Access.REPOSITORY.value, Access.WORKERS.value):
        raise SluiceError("this route needs an admin key", ErrorKind.PERMISSION_DENIED)
