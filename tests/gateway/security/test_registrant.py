"""What a registration key may name: addresses compared as IP addresses, names resolved (or refused)."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from starlette.requests import Request

from engines.errors import ErrorKind, SluiceError
from gateway.security.access import SCOPE_ADMIN_SCOPES
from gateway.security.keys import ALL_SCOPES
from gateway.security.registrant import require_own_address


def _request(peer: str, scopes: frozenset[str] | None, headers: dict[str, str] | None = None) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/v1/admin/workers", "client": (peer, 5000),
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    if scopes is not None:
        scope[SCOPE_ADMIN_SCOPES] = scopes
    return Request(scope)


REGISTRATION = frozenset({"workers"})


@pytest.mark.parametrize(("peer", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8100"),
    ("::ffff:10.1.2.3", "http://10.1.2.3:8100/"),  # a dual-stack socket's view of an IPv4 peer
    ("::1", "http://[::1]:8100"),
    ("10.0.0.7", "https://10.0.0.7"),
])
async def test_its_own_address_is_accepted(peer: str, url: str) -> None:
    await require_own_address(_request(peer, REGISTRATION), url, "register")


@pytest.mark.parametrize(("peer", "url", "scopes", "headers"), [
    ("127.0.0.1", "http://127.0.0.2:8100", REGISTRATION, {}),
    ("10.0.0.7", "http://10.0.0.8:8100", REGISTRATION, {}),
    ("127.0.0.1", "http://127.0.0.1:8100", REGISTRATION, {"X-Real-IP": "127.0.0.1"}),  # through a proxy
    ("127.0.0.1", "http://no-such-host.invalid:8100", REGISTRATION, {}),  # unresolvable: refused
    ("127.0.0.1", "http://127.0.0.2:8100", None, {}),  # no scopes recorded: confined (fails closed)
    ("testclient", "http://127.0.0.1:8100", REGISTRATION, {}),  # no IP address
])
async def test_another_address_is_refused(peer: str, url: str, scopes: frozenset[str] | None,
                                          headers: dict[str, str]) -> None:
    with pytest.raises(SluiceError) as refused:
        await require_own_address(_request(peer, scopes, headers), url, "register")
    assert refused.value.kind is ErrorKind.PERMISSION_DENIED and refused.value.code == "worker_address_not_caller"


async def test_a_name_must_resolve_to_the_callers_address_only() -> None:
    # localhost names 127.0.0.1 (and ::1 where configured): every address must be the caller's.
    resolved = {ipaddress.ip_address(i[4][0]) for i in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)}
    if resolved == {ipaddress.ip_address("127.0.0.1")}:
        await require_own_address(_request("127.0.0.1", REGISTRATION), "http://localhost:8100", "register")
    else:
        with pytest.raises(SluiceError):
            await require_own_address(_request("127.0.0.1", REGISTRATION), "http://localhost:8100", "register")
    with pytest.raises(SluiceError):
        await require_own_address(_request("127.0.0.2", REGISTRATION), "http://localhost:8100", "register")


async def test_a_full_admin_key_names_any_url() -> None:
    await require_own_address(_request("127.0.0.1", ALL_SCOPES, {"X-Forwarded-For": "x"}), "http://10.9.9.9",
                              "register")
