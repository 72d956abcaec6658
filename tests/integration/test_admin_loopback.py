"""A server with no keys at all: it says inference is open, and admin routes answer only direct loopback peers.

The server listens on every interface, so the tests reach it both from
127.0.0.1 and from this machine's own non-loopback address (a real non-loopback
peer). A loopback request that carries forwarding headers came through a proxy
and is refused too; uvicorn applies no forwarded header unless told to.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import wait_for
from tests.integration.security_support import non_loopback_address, secured_repository
from tests.servers import Server, start_server

pytestmark = pytest.mark.integration

FORWARDED = [{"X-Forwarded-For": "127.0.0.1"}, {"Forwarded": "for=127.0.0.1"}, {"X-Real-IP": "127.0.0.1"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("open")
    repo, _ = secured_repository(tmp, llm=False)
    srv = start_server(["--host", "0.0.0.0", "--model-repository", str(repo), "--model-control-mode", "explicit",
                        "--load-model", "*"], tmp / "server.log", grpc=True)
    yield srv
    srv.stop()


def test_no_api_keys_is_announced_loudly(server: Server) -> None:
    assert any(" WARNING sluice.startup: NO API KEYS CONFIGURED: inference is open to anyone" in line
               for line in server.log().splitlines())
    assert httpx.get(server.url + "/v1/models").status_code == 200  # and it is open


def test_admin_routes_answer_a_direct_loopback_peer(server: Server) -> None:
    assert httpx.get(server.url + "/v1/admin/workers").status_code == 200
    r = httpx.post(server.url + "/v2/repository/models/add_sub/unload")
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v2/repository/models/add_sub/load")
    assert r.status_code == 200, r.text
    assert httpx.get(server.url + "/v2/models/add_sub/ready").status_code == 200


@pytest.mark.parametrize("headers", FORWARDED)
def test_forwarded_requests_from_loopback_are_not_local(server: Server, headers: dict[str, str]) -> None:
    r = httpx.get(server.url + "/v1/admin/workers", headers=headers)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.post(server.url + "/v2/repository/models/add_sub/unload", headers=headers)
    assert r.status_code == 403 and set(r.json()) == {"error"}
    assert httpx.get(server.url + "/v2/models/add_sub/ready").status_code == 200  # still loaded


def test_a_non_loopback_peer_is_refused_admin(server: Server) -> None:
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address")
    url = f"http://{address}:{server.http_port}"
    r = httpx.get(url + "/v1/admin/workers")
    assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
    assert httpx.post(url + "/v2/repository/models/add_sub/unload").status_code == 403
    assert httpx.get(url + "/v1/models").status_code == 200  # inference is open (no API keys)
    client = grpcclient.InferenceServerClient(f"{address}:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("add_sub")
    assert e.value.status() == "StatusCode.PERMISSION_DENIED"
    assert client.is_model_ready("add_sub")


def test_grpc_repository_rpcs_answer_only_direct_loopback(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    with pytest.raises(InferenceServerException) as e:
        client.unload_model("add_sub", headers={"x-forwarded-for": "127.0.0.1"})
    assert e.value.status() == "StatusCode.PERMISSION_DENIED" and client.is_model_ready("add_sub")
    client.unload_model("add_sub")
    wait_for(lambda: not client.is_model_ready("add_sub"), "add_sub to unload")
    client.load_model("add_sub")
    wait_for(lambda: client.is_model_ready("add_sub"), "add_sub to load")
    x = np.ones(4, dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    for inp in inputs:
        inp.set_data_from_numpy(x)
    assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [2.0] * 4


def test_untrusted_forwarded_headers_are_ignored(server: Server) -> None:
    # uvicorn's default would trust X-Forwarded-* from 127.0.0.1; without --forwarded-allow-ips, nothing is.
    r = httpx.get(server.url + "/v2/health/live/", headers={"X-Forwarded-Proto": "https"})
    assert r.status_code == 307 and r.headers["location"].startswith("http://")


def test_no_cors_headers_unless_configured(server: Server) -> None:
    r = httpx.options(server.url + "/v1/models", headers={"Origin": "https://app.example",
                                                          "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "https://app.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("headers", [{"Origin": "https://evil.example"}, {"Origin": "null"},
                                     {"Origin": "http://127.0.0.1"}])
def test_keyless_admin_refuses_browser_pages(server: Server, headers: dict[str, str]) -> None:
    """CSRF: a page on this machine can reach 127.0.0.1, but its request carries an Origin."""
    r = httpx.get(server.url + "/v1/admin/workers", headers=headers)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error" and "Origin" in r.text
    r = httpx.post(server.url + "/v2/repository/models/add_sub/unload", headers=headers)
    assert r.status_code == 403 and set(r.json()) == {"error"}
    assert httpx.get(server.url + "/v2/models/add_sub/ready").status_code == 200  # still loaded


@pytest.mark.parametrize("host", ["evil.example", f"evil.example:{8000}", "127.0.0.1.evil.example"])
def test_keyless_admin_refuses_a_rebound_host(server: Server, host: str) -> None:
    """DNS rebinding: the page's own name now resolves to 127.0.0.1, and its requests say that name."""
    r = httpx.get(server.url + "/v1/admin/workers", headers={"Host": host})
    assert r.status_code == 403 and "Host" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v2/repository/models/add_sub/unload", headers={"Host": host})
    assert r.status_code == 403
    assert httpx.get(server.url + "/v1/models", headers={"Host": host}).status_code == 200  # not an admin route


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
def test_keyless_admin_takes_loopback_hosts(server: Server, host: str) -> None:
    r = httpx.get(server.url + "/v1/admin/workers", headers={"Host": f"{host}:{server.http_port}"})
    assert r.status_code == 200, r.text
