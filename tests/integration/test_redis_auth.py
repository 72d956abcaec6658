"""Redis with an ACL user and over TLS, a real redis-server each, and what /health says about quotas.

Two gateway replicas that hold the ACL user's password (in a file, never on the
command line) share per-key quotas; a replica with a wrong password, or one
that cannot verify the TLS server, refuses to start with a message that names
the cause and never the password. Quotas without shared Redis are reported in
`/health` details and `sluice_quota_local`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.kserve_support import wait_for
from tests.integration.security_support import bearer, metrics, new_key, secured_repository, write_keys
from tests.redis_server import HAVE_REDIS, RedisServer
from tests.servers import Server, metric_value, start_server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed (make apt)")]

PASSWORD = new_key("redis-password")
RPM = new_key("rpm")
# The default user is off; `sluice` may touch only Sluice's keys.
ACL = ("--user", "default", "off", "--user", "sluice", "on", f">{PASSWORD}", "~sluice:*", "&*", "+@all")


def _gateway(tmp: Path, redis_url: str, *extra: str, env: dict[str, str] | None = None,
             wait: bool = True) -> Server:
    repo, _ = secured_repository(tmp, llm=False)
    keys = write_keys(tmp / "keys.yaml", {"rpm": (RPM, {"rpm": 2})})
    return start_server(["--model-repository", str(repo), "--api-keys-file", str(keys), "--redis-url", redis_url,
                         *extra], tmp / "gateway.log", env=env, ready_timeout_s=120, wait=wait)


def _refused_start(tmp: Path, redis_url: str, *extra: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(RuntimeError, match="server exited with") as e:
        _gateway(tmp, redis_url, *extra, env=env)
    return str(e.value)


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    srv = RedisServer(ACL, {"username": "sluice", "password": PASSWORD}).start()
    yield srv
    srv.kill()


def test_replicas_share_quotas_through_an_acl_user(acl_redis: RedisServer, tmp_path: Path) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text(PASSWORD + "\n")
    url = acl_redis.url.replace("redis://", "redis://sluice@")
    a = _gateway(tmp_path / "a", url, "--redis-password-file", str(secret))
    b = _gateway(tmp_path / "b", url, env={"SLUICE_REDIS_PASSWORD": PASSWORD})
    try:
        assert PASSWORD not in " ".join(map(str, a.proc.args)) + a.log() + b.log()
        for server in (a, b):
            assert httpx.get(server.url + "/v1/models", headers=bearer(RPM)).status_code == 200
        r = httpx.get(b.url + "/v1/models", headers=bearer(RPM))  # the third in a minute, over two replicas
        assert r.status_code == 429, r.text
        health = httpx.get(a.url + "/health").json()
        assert health["details"]["quotas"] == "shared through Redis"
        assert metric_value(metrics(a), "sluice_quota_local") == 0
        assert acl_redis.client().keys("sluice:quota:*")  # the ACL user wrote them
    finally:
        a.stop()
        b.stop()


def test_a_wrong_password_fails_start_up_clearly(acl_redis: RedisServer, tmp_path: Path) -> None:
    wrong = new_key("wrong-password")
    url = acl_redis.url.replace("redis://", "redis://sluice@")
    out = _refused_start(tmp_path / "wrong", url, env={"SLUICE_REDIS_PASSWORD": wrong})
    assert "refused the credentials" in out and wrong not in out
    out = _refused_start(tmp_path / "none", acl_redis.url)  # the default user is off
    assert "refused the credentials" in out


def test_quotas_without_redis_say_so(tmp_path: Path) -> None:
    repo, _ = secured_repository(tmp_path, llm=False)
    keys = write_keys(tmp_path / "keys.yaml", {"rpm": (RPM, {"rpm": 2})})
    server = start_server(["--model-repository", str(repo), "--api-keys-file", str(keys)], tmp_path / "gateway.log")
    try:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 200 and "per-replica (no --redis-url)" in r.json()["details"]["quotas"]
        assert metric_value(metrics(server), "sluice_quota_local") == 1
    finally:
        server.stop()


def test_losing_redis_shows_in_health(tmp_path: Path) -> None:
    redis_server = RedisServer().start()
    server = _gateway(tmp_path, redis_server.url)
    try:
        assert httpx.get(server.url + "/health").json()["details"]["quotas"] == "shared through Redis"
        redis_server.kill()
        httpx.get(server.url + "/v1/models", headers=bearer(RPM))  # the first call to fail finds Redis gone
        wait_for(lambda: "Redis is unreachable" in httpx.get(server.url + "/health").json()["details"]["quotas"],
                 "/health to report per-replica quotas")
        assert httpx.get(server.url + "/health").status_code == 200  # degraded, not unavailable
        assert metric_value(metrics(server), "sluice_quota_local") == 1
    finally:
        server.stop()
        redis_server.kill()


# -- TLS ------------------------------------------------------------------------------------------------------------
def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _certificates(tmp: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate it signed for 127.0.0.1: (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (tmp / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", "/CN=sluice-test-ca")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    ext = tmp / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-out",
             str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def test_rediss_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    tls = RedisServer(("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                       "--tls-auth-clients", "no"), {"ssl": True, "ssl_ca_certs": str(ca)}, tls=True)
    try:
        tls.start()
    except RuntimeError:
        pytest.skip("this redis-server build cannot serve TLS (--tls-port)")
    try:
        assert tls.url.startswith("rediss://")
        server = _gateway(tmp_path / "ok", tls.url, "--redis-ca-file", str(ca))
        try:
            assert httpx.get(server.url + "/health").json()["details"]["quotas"] == "shared through Redis"
            assert httpx.get(server.url + "/v1/models", headers=bearer(RPM)).status_code == 200
            assert tls.client().keys("sluice:quota:*")
        finally:
            server.stop()
        out = _refused_start(tmp_path / "no-ca", tls.url)  # the system's CAs do not know this one
        assert "TLS handshake failed" in out
    finally:
        tls.kill()
