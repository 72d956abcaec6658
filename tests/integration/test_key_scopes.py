"""Admin key scopes on one real `sluice serve`: repository, workers, metrics, and the registration key.

A key opens only the routes and RPCs of its scopes; a known key of the wrong
scope gets 403 in the route's protocol (OpenAI JSON, KServe JSON, gRPC
PERMISSION_DENIED), no key or an unknown one 401. A real `sluice worker --engine sim
--gateway` registers with the registration key from SLUICE_REGISTRATION_KEY.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.integration.security_support import bearer, new_key, secured_repository
from tests.integration.vllm_support import ROOT, tiny_llama_dir
from tests.servers import Server, free_port, start_server

pytestmark = pytest.mark.integration

REPO, SCRAPE, ALL, REGISTRATION = new_key("repo"), new_key("scrape"), new_key("all"), new_key("registration")
UNKNOWN = new_key("unknown")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("scopes")
    repo, _ = secured_repository(tmp, llm=False)
    admin = tmp / "admin.yaml"
    admin.write_text(yaml.safe_dump([{"id": "repo-ops", "key": REPO, "scopes": ["repository"]},
                                     {"id": "scraper", "key": SCRAPE, "scopes": ["metrics"]},
                                     {"id": "root", "key": ALL}]))
    registration = tmp / "registration.key"
    registration.write_text(REGISTRATION + "\n")
    srv = start_server(["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "*",
                        "--admin-keys-file", str(admin), "--registration-key-file", str(registration),
                        "--metrics-require-key"], tmp / "server.log", grpc=True)
    yield srv
    srv.stop()


def test_worker_routes_need_the_workers_scope(server: Server) -> None:
    url = server.url + "/v1/admin/workers"
    for key in (REGISTRATION, ALL):
        assert httpx.get(url, headers=bearer(key)).status_code == 200
    for key in (REPO, SCRAPE):
        r = httpx.get(url, headers=bearer(key))
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert error["type"] == "permission_error" and "'workers' scope" in error["message"] and key not in r.text
    r = httpx.post(url, json={"bogus": 1}, headers=bearer(REPO))  # refused before the body is read
    assert r.status_code == 403 and "bogus" not in r.text
    for headers in ({}, bearer(UNKNOWN)):  # loopback has no free pass once keys exist
        assert httpx.get(url, headers=headers).status_code == 401


def test_repository_control_needs_the_repository_scope_over_http(server: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    for key in (REGISTRATION, SCRAPE):
        with pytest.raises(InferenceServerException) as e:
            client.unload_model("add_sub", headers=bearer(key))
        assert e.value.status() == "403" and "'repository' scope" in e.value.message()
    r = httpx.post(server.url + "/v2/repository/models/add_sub/unload", headers=bearer(REGISTRATION))
    assert r.status_code == 403 and set(r.json()) == {"error"}  # KServe's error shape
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("add_sub")
    assert e.value.status() == "401"
    assert client.is_model_ready("add_sub")
    client.unload_model("add_sub", headers=bearer(REPO))
    client.load_model("add_sub", headers=bearer(REPO))
    assert client.is_model_ready("add_sub")


def test_repository_control_needs_the_repository_scope_over_grpc(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    for key in (REGISTRATION, SCRAPE):
        with pytest.raises(InferenceServerException) as e:
            client.unload_model("add_sub", headers=bearer(key))
        assert e.value.status() == "StatusCode.PERMISSION_DENIED" and key not in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("add_sub")
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    assert client.is_model_ready("add_sub")
    client.unload_model("add_sub", headers=bearer(ALL))
    client.load_model("add_sub", headers=bearer(ALL))
    assert client.is_model_ready("add_sub")


def test_metrics_need_the_metrics_scope(server: Server) -> None:
    url = server.url + "/metrics"
    for key in (SCRAPE, ALL):
        r = httpx.get(url, headers=bearer(key))
        assert r.status_code == 200 and "sluice_auth_failures_total" in r.text
    for key in (REGISTRATION, REPO):
        r = httpx.get(url, headers=bearer(key))
        assert r.status_code == 403 and "'metrics' scope" in r.text
    assert httpx.get(url).status_code == 401
    text = httpx.get(url, headers=bearer(SCRAPE)).text
    assert 'sluice_auth_failures_total{access="workers"}' in text and 'access="repository"' in text


def test_a_worker_registers_with_the_registration_key_only(server: Server, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", "sim-scopes", "--port", str(port), "--kv-events-port", str(free_port()),
         "--name", "scoped", "--gateway", server.url],
        # An admin key in reach is not what it sends: this one (repository scope) would get 403.
        cwd=ROOT, start_new_session=True,
        env={**env, "SLUICE_REGISTRATION_KEY": REGISTRATION, "SLUICE_ADMIN_KEY": REPO},
        stdout=(tmp_path / "worker.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        names: list[str] = []
        for _ in range(600):  # bounded: the worker starts, then registers
            listed = httpx.get(server.url + "/v1/admin/workers", headers=bearer(ALL)).json()["data"]
            names = [w["name"] for w in listed]
            if "scoped" in names or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert "scoped" in names, (tmp_path / "worker.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(30)


def _from(address: str) -> httpx.Client:
    """A client whose socket is bound to `address` (any 127.0.0.0/8 address reaches the loopback server)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


def test_a_registration_key_names_only_its_own_address(server: Server, tmp_path: Path) -> None:
    """Every worker pod holds the registration key: it registers, deregisters and drains only a worker
    whose URL host is the caller's own address, never through a proxy; a full admin key names any URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", "sim-own", "--host", "127.0.0.2", "--port", str(port), "--no-kv-events"],
        cwd=ROOT, start_new_session=True, env=env, stdout=(tmp_path / "worker.log").open("wb"),
        stderr=subprocess.STDOUT)
    url, admin = f"http://127.0.0.2:{port}", server.url + "/v1/admin/workers"
    record = {"name": "own", "url": url, "engine": "sim", "tokenizer": str(tiny_llama_dir())}
    try:
        for _ in range(600):  # bounded: the worker starts
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            time.sleep(0.1)
        with _from("127.0.0.1") as here, _from("127.0.0.2") as there:
            for client, headers in ((here, {}), (there, {"X-Forwarded-For": "127.0.0.2"})):
                r = client.post(admin, json=record, headers={**bearer(REGISTRATION), **headers})
                assert r.status_code == 403, r.text
                error = r.json()["error"]
                assert error["type"] == "permission_error" and error["code"] == "worker_address_not_caller"
                assert REGISTRATION not in r.text
            assert "own" not in [w["name"] for w in here.get(admin, headers=bearer(ALL)).json()["data"]]
            assert there.post(admin, json=record, headers=bearer(REGISTRATION)).status_code == 201
            # Another host's registration key can neither drain nor remove it; its own can.
            for r in (here.post(f"{admin}/own/drain", headers=bearer(REGISTRATION)),
                      here.delete(f"{admin}/own", headers=bearer(REGISTRATION))):
                assert r.status_code == 403 and r.json()["error"]["code"] == "worker_address_not_caller", r.text
            assert "own" in [w["name"] for w in here.get(admin, headers=bearer(ALL)).json()["data"]]
            assert there.post(f"{admin}/own/drain", headers=bearer(REGISTRATION)).json()["draining"] is True
            assert there.delete(f"{admin}/own", headers=bearer(REGISTRATION)).status_code == 204
            # A full admin key (repository and workers scopes) registers any URL, from anywhere.
            assert here.post(admin, json=record, headers=bearer(ALL)).status_code == 201
            assert here.delete(f"{admin}/own", headers=bearer(ALL)).status_code == 204
    finally:
        proc.terminate()
        proc.wait(30)
