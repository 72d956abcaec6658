"""The access table and peer rules, as plain functions."""

from __future__ import annotations

import pytest

from gateway.security.access import (
    Access,
    bearer,
    browser_refusal,
    classify_path,
    classify_rpc,
    grpc_peer_host,
    is_local,
    is_loopback_authority,
)


@pytest.mark.parametrize(("path", "access"), [
    ("/health", Access.OPEN), ("/version", Access.OPEN), ("/", Access.OPEN), ("/ui/app.js", Access.OPEN),
    ("/v2/health/live", Access.OPEN),
    ("/v2/health/ready", Access.OPEN),
    ("/metrics", Access.METRICS),
    ("/v1/admin/workers", Access.WORKERS), ("/v1/admin/workers/w0/drain", Access.WORKERS),
    ("/v1/admin", Access.REPOSITORY), ("/v1/admin/models", Access.REPOSITORY),
    ("/v1/admin/workersx", Access.REPOSITORY),
    ("/v2/repository/models/digits/load", Access.REPOSITORY),
    ("/v2/repository/models/digits/unload", Access.REPOSITORY),
    ("/v2/repository/index", Access.API), ("/v1/chat/completions", Access.API), ("/tokenize", Access.API),
    ("/detokenize", Access.API), ("/v2/models/digits/infer", Access.API), ("/v2", Access.API),
    ("/docs", Access.API), ("/nowhere", Access.API), ("/v1/administrator", Access.API),
])
def test_paths(path: str, access: Access) -> None:
    assert classify_path(path) is access


def test_rpcs() -> None:
    svc = "/inference.GRPCInferenceService/"
    assert classify_rpc(svc + "ServerLive") is Access.OPEN and classify_rpc(svc + "ServerReady") is Access.OPEN
    assert classify_rpc(svc + "RepositoryModelLoad") is Access.REPOSITORY
    assert classify_rpc(svc + "RepositoryModelUnload") is Access.REPOSITORY
    assert classify_rpc(svc + "ModelInfer") is Access.API and classify_rpc(svc + "ModelStreamInfer") is Access.API
    assert classify_rpc("/other.Service/ServerLive") is Access.API


def test_bearer() -> None:
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("abc") is None and bearer(None) is None and bearer("Bearer ") is None


def test_local_peers() -> None:
    assert is_local("127.0.0.1", set()) and is_local("127.8.0.1", set()) and is_local("::1", set())
    assert is_local("::ffff:127.0.0.1", {"authorization"})
    assert not is_local("192.0.2.2", set()) and not is_local(None, set()) and not is_local("localhost", set())
    for header in ("x-forwarded-for", "forwarded", "x-real-ip"):
        assert not is_local("127.0.0.1", {header})


def test_grpc_peer() -> None:
    assert grpc_peer_host("ipv4:127.0.0.1:50051") == "127.0.0.1"
    assert grpc_peer_host("ipv6:[::1]:50051") == "::1"
    assert grpc_peer_host("unix:/tmp/sock") is None


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "LOCALHOST:1", "127.0.0.1", "127.0.0.1:8000",
                                  "127.9.9.9:80", "[::1]", "[::1]:8000", "::1"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_authority(host) and browser_refusal(None, host) is None


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "10.0.0.1:8000",
                                  "[2001:db8::1]:80", "127.0.0.1.nip.io", ""])
def test_other_hosts_are_not_loopback(host: str) -> None:
    assert not is_loopback_authority(host) and browser_refusal(None, host) is not None


def test_an_origin_is_a_browser() -> None:
    assert browser_refusal(None, None) is None  # HTTP/1.0 without Host: not a browser
    assert browser_refusal("http://127.0.0.1:8000", "127.0.0.1:8000") is not None
    assert browser_refusal("null", "localhost") is not None
