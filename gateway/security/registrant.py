"""What a registration key may name: only a worker at the caller's own address.

Every worker pod holds the registration key (`workers` scope alone), so one
compromised worker holds it too. Were any URL accepted, that worker could register
an endpoint of its choosing under any name and model, receive those prompts, and
have its registration vouch for the (name, URL) pair to Kubernetes discovery. So a
principal without the `repository` scope (the registration key, or any admin key
restricted to `workers`) may register, deregister or drain only a worker
whose URL host is the socket peer's own IP address: compared as IP addresses, a
host name resolved first (every address it resolves to must be the peer's), and
never through a proxy (a request with forwarding headers proves no address). A full
admin key (`repository` and `workers`) and a keyless loopback admin may name any URL.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from starlette.requests import Request

from engines.errors import ErrorKind, SluiceError
from gateway.security.access import FORWARDING_HEADERS, SCOPE_ADMIN_SCOPES, Access

_RESOLVE_TIMEOUT_S = 5.0
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def confined(request: Request) -> bool:
    """Whether this admin principal may name only its own address (fails closed: no recorded scopes)."""
    scopes = request.scope.get(SCOPE_ADMIN_SCOPES)
    return not isinstance(scopes, frozenset) or Access.REPOSITORY.value not in scopes


async def require_own_address(request: Request, url: str, action: str) -> None:
    """Raise PERMISSION_DENIED unless `url`'s host is the caller's own address (a confined caller only).
    `action` names what was refused, for the message ("register", "deregister", "drain")."""
    if not confined(request):
        return
    if FORWARDING_HEADERS & {name.lower() for name in request.headers}:
        raise _refuse(f"A registration key may {action} only a worker at its own address, which a request "
                      "that came through a proxy (forwarding headers) cannot prove; connect directly.")
    peer = _ip(request.client.host if request.client else None)
    if peer is None:
        raise _refuse(f"A registration key may {action} only a worker at its own address; this "
                      "connection has no IP address.")
    host = urlsplit(url).hostname or ""
    addresses = await _resolve(host)
    if not addresses or any(a != peer for a in addresses):
        raise _refuse(f"A registration key may {action} only a worker whose URL host is the caller's own "
                      f"address ({peer}); {host!r} is not. Register with a full admin key (repository and "
                      "workers scopes) to name another host.")


async def _resolve(host: str) -> set[Address]:
    """The IP addresses `host` names (a literal, or every address a name resolves to); empty if none."""
    literal = _ip(host)
    if literal is not None:
        return {literal}
    if not host:
        return set()
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM),
                                       _RESOLVE_TIMEOUT_S)
    except (OSError, UnicodeError):  # TimeoutError is an OSError
        return set()
    return {a for a in (_ip(str(info[4][0])) for info in infos) if a is not None}


def _ip(host: str | None) -> Address | None:
    """An IP address, IPv4-mapped IPv6 as its IPv4 (a dual-stack socket's view of an IPv4 peer)."""
    try:
        ip = ipaddress.ip_address((host or "").strip("[]"))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped if mapped is not None else ip


def _refuse(message: str) -> SluiceError:
    return SluiceError(message, ErrorKind.PERMISSION_DENIED, code="worker_address_not_caller")
