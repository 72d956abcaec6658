"""API keys, admin keys, CORS, /metrics and per-key quotas on one real `sluice serve`, with real clients.

The server has API keys from a keys file (some with limits), admin keys from
SLUICE_ADMIN_KEYS and SLUICE_ADMIN_KEY, `--metrics-require-key`, CORS for one
origin and uvicorn told to trust a proxy on 127.0.0.1. Quotas here are local (no
Redis); `test_quotas_redis.py` shares them between replicas.
"""

from __future__ import annotations

import queue
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import anthropic
import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.kserve_support import wait_for
from tests.integration.security_support import (
    EMBEDDINGS,
    bearer,
    close_gate,
    metrics,
    new_key,
    open_gate,
    sdk,
    secured_repository,
    wait_started,
    write_keys,
)
from tests.servers import LLM_NAME, Server, metric_value, start_server

pytestmark = pytest.mark.integration

ADMIN, LEGACY_ADMIN, BOTH, INVALID = new_key("admin"), new_key("legacy"), new_key("both"), new_key("invalid")
KEYS: dict[str, tuple[str, dict[str, int]]] = {
    "team-a": (new_key("team-a"), {}),
    "both": (BOTH, {}),  # listed as an API key and as an admin key
    "rpm": (new_key("rpm"), {"rpm": 2}),
    "http-rpm": (new_key("http-rpm"), {"rpm": 1}),
    "grpc-rpm": (new_key("grpc-rpm"), {"rpm": 1}),
    "stream-rpm": (new_key("stream-rpm"), {"rpm": 2}),
    "conc": (new_key("conc"), {"concurrency": 1}),
    "tpm": (new_key("tpm"), {"tpm": 40}),
    "emb": (new_key("emb"), {"tpm": 12}),
}
TEAM_A = KEYS["team-a"][0]
ORIGIN = "https://app.example"
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("secured")
    repo, _ = secured_repository(tmp, embeddings=True)
    keys = write_keys(tmp / "keys.yaml", KEYS)
    srv = start_server(["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "*",
                        "--api-keys-file", str(keys), "--metrics-require-key", "--cors-allow-origins", ORIGIN,
                        "--forwarded-allow-ips", "127.0.0.1"],
                       tmp / "server.log", grpc=True,
                       env={"SLUICE_ADMIN_KEYS": f"{ADMIN},{BOTH}", "SLUICE_ADMIN_KEY": LEGACY_ADMIN})
    yield srv
    srv.stop()


def http_client(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")


def grpc_client(server: Server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def add_sub_inputs(module: type) -> list:
    x = np.arange(4, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    for inp in inputs:
        inp.set_data_from_numpy(x)
    return inputs


# -- authentication -----------------------------------------------------------------------------------------------
def test_openai_routes_answer_401_without_a_valid_key(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as e:
        sdk(server, INVALID).chat.completions.create(model=LLM_NAME, messages=MSG, max_tokens=2)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    assert e.value.response.headers["www-authenticate"] == "Bearer" and INVALID not in e.value.response.text
    for method, path, body in [("GET", "/v1/models", None),
                               ("POST", "/v1/completions", {"model": LLM_NAME, "prompt": "x"}),
                               ("POST", "/v1/embeddings", {"model": EMBEDDINGS, "input": "x"}),
                               ("POST", "/tokenize", {"model": LLM_NAME, "prompt": "x"}),
                               ("POST", "/detokenize", {"model": LLM_NAME, "tokens": [1]})]:
        r = httpx.request(method, server.url + path, json=body)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    # Refused before the body is read: a stranger's malformed JSON gets 401, not a parser message.
    r = httpx.post(server.url + "/v1/chat/completions", content=b'{"model": ', headers=bearer(INVALID))
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):  # an admin key is not an API key
        sdk(server, ADMIN).models.list()


def test_a_valid_key_opens_openai_kserve_http_and_grpc(server: Server) -> None:
    out = sdk(server, TEAM_A).chat.completions.create(model=LLM_NAME, messages=MSG, max_tokens=2)
    assert out.choices[0].finish_reason in ("stop", "length")
    r = http_client(server).infer("add_sub", add_sub_inputs(httpclient), headers=bearer(TEAM_A))
    assert r.as_numpy("OUTPUT0").tolist() == [0.0, 2.0, 4.0, 6.0]
    g = grpc_client(server)
    out = g.infer("add_sub", add_sub_inputs(grpcclient), headers=bearer(TEAM_A))
    assert out.as_numpy("OUTPUT1").tolist() == [0.0] * 4
    assert sdk(server, BOTH).models.list().data  # a key listed as both opens inference too


def test_anthropic_clients_send_the_key_as_x_api_key(server: Server) -> None:
    """The `anthropic` SDK sends `x-api-key`; a refusal is in Anthropic's shape and never echoes the key."""
    def claude(key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)

    out = claude(TEAM_A).messages.create(model=LLM_NAME, max_tokens=2, messages=MSG)
    assert out.usage.output_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as e:
        claude(INVALID).messages.create(model=LLM_NAME, max_tokens=2, messages=MSG)
    assert e.value.body == {"type": "error", "error": {"type": "authentication_error", "message": ANY}}
    assert INVALID not in e.value.response.text
    with pytest.raises(anthropic.AuthenticationError):  # an admin key is not an API key
        claude(ADMIN).messages.count_tokens(model=LLM_NAME, messages=MSG)
    r = httpx.post(server.url + "/v1/messages", json={"model": LLM_NAME, "max_tokens": 2, "messages": MSG})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_a_stored_response_is_visible_only_to_the_key_that_made_it(server: Server) -> None:
    mine = sdk(server, TEAM_A).responses.create(model=LLM_NAME, input="Hi", max_output_tokens=2)
    other = sdk(server, BOTH)
    for attempt in (lambda: other.responses.retrieve(mine.id), lambda: other.responses.delete(mine.id),
                    lambda: other.responses.input_items.list(mine.id),
                    lambda: other.responses.create(model=LLM_NAME, input="And?", max_output_tokens=2,
                                                   previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError):  # as if it did not exist: its existence is not leaked
            attempt()
    assert sdk(server, TEAM_A).responses.retrieve(mine.id).id == mine.id


def test_kserve_http_answers_401_in_its_own_shape(server: Server) -> None:
    client = http_client(server)
    assert client.is_server_live() and client.is_server_ready()  # load balancers' probes stay open
    with pytest.raises(InferenceServerException) as e:
        client.infer("add_sub", add_sub_inputs(httpclient))
    assert e.value.status() == "401" and "API key" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("add_sub", headers=bearer(INVALID))
    assert e.value.status() == "401" and INVALID not in str(e.value)
    r = httpx.get(server.url + "/v2/models/add_sub", headers=bearer(INVALID))
    assert r.status_code == 401 and set(r.json()) == {"error"} and r.headers["www-authenticate"] == "Bearer"


def test_grpc_answers_unauthenticated(server: Server) -> None:
    client = grpc_client(server)
    assert client.is_server_live() and client.is_server_ready()
    for headers in (None, bearer(INVALID), {"authorization": INVALID}, bearer(ADMIN)):
        with pytest.raises(InferenceServerException) as e:
            client.infer("add_sub", add_sub_inputs(grpcclient), headers=headers)
        assert e.value.status() == "StatusCode.UNAUTHENTICATED" and INVALID not in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("add_sub")
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    errors: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: errors.put(error), headers=bearer(INVALID))
    try:
        client.async_stream_infer("add_sub", add_sub_inputs(grpcclient))
    except InferenceServerException:
        pass  # the stream was refused already; the callback has the reason
    error = errors.get(timeout=60)
    client.stop_stream()
    assert error is not None and "UNAUTHENTICATED" in str(error.status())


def test_health_stays_open_and_metrics_needs_a_key(server: Server) -> None:
    for path in ("/health", "/v2/health/live", "/v2/health/ready"):
        assert httpx.get(server.url + path).status_code == 200, path
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/metrics", headers=bearer(INVALID)).status_code == 401
    assert httpx.get(server.url + "/metrics", headers=bearer(TEAM_A)).status_code == 401  # not an API key's
    assert "sluice_requests_total" in metrics(server, ADMIN)


# -- admin ----------------------------------------------------------------------------------------------------------
def test_admin_routes_need_an_admin_key(server: Server) -> None:
    url = server.url + "/v1/admin/workers"
    for headers in ({}, bearer(TEAM_A), bearer(INVALID)):  # an API key is not an admin key
        r = httpx.get(url, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(url, json={"bogus": 1}, headers=bearer(TEAM_A))  # refused before validation says anything
    assert r.status_code == 401 and "bogus" not in r.text
    for key in (ADMIN, LEGACY_ADMIN, BOTH):
        assert httpx.get(url, headers=bearer(key)).status_code == 200
    # Behind a proxy the key is what counts; the forwarded address changes nothing.
    assert httpx.get(url, headers={**bearer(ADMIN), "X-Forwarded-For": "203.0.113.7"}).status_code == 200


def test_repository_load_and_unload_need_an_admin_key_over_http(server: Server) -> None:
    client, api = http_client(server), bearer(TEAM_A)
    for headers in ({}, api, bearer(INVALID)):
        with pytest.raises(InferenceServerException) as e:
            client.unload_model("add_sub", headers=headers)
        assert e.value.status() == "401"
    assert client.is_model_ready("add_sub", headers=api)
    client.unload_model("add_sub", headers=bearer(ADMIN))
    wait_for(lambda: not client.is_model_ready("add_sub", headers=api), "add_sub to unload")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_sub", headers=api)
    assert e.value.status() == "401" and not client.is_model_ready("add_sub", headers=api)
    client.load_model("add_sub", headers=bearer(ADMIN))
    wait_for(lambda: client.is_model_ready("add_sub", headers=api), "add_sub to load")


def test_repository_load_and_unload_need_an_admin_key_over_grpc(server: Server) -> None:
    client, api = grpc_client(server), bearer(TEAM_A)
    for headers in (None, api, bearer(INVALID)):
        with pytest.raises(InferenceServerException) as e:
            client.unload_model("add_sub", headers=headers)
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    assert client.is_model_ready("add_sub", headers=api)
    client.unload_model("add_sub", headers=bearer(ADMIN))
    wait_for(lambda: not client.is_model_ready("add_sub", headers=api), "add_sub to unload")
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_sub", headers=api)
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    client.load_model("add_sub", headers=bearer(ADMIN))
    wait_for(lambda: client.is_model_ready("add_sub", headers=api), "add_sub to load")


# -- CORS and proxies -------------------------------------------------------------------------------------------------
def test_cors_preflight_needs_no_key(server: Server) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server.url + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = httpx.options(server.url + "/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN})  # the page can read why it was refused
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN, **bearer(TEAM_A)})
    assert r.status_code == 200 and "x-request-id" in r.headers["access-control-expose-headers"].lower()


def test_a_trusted_proxys_headers_reach_uvicorn(server: Server) -> None:
    # --forwarded-allow-ips 127.0.0.1: X-Forwarded-Proto from this peer is applied (redirects say https).
    r = httpx.get(server.url + "/v2/health/live/", headers={**bearer(TEAM_A), "X-Forwarded-Proto": "https"})
    assert r.status_code == 307 and r.headers["location"].startswith("https://")


# -- quotas (local) -------------------------------------------------------------------------------------------------
def _retry_after(e: pytest.ExceptionInfo) -> int:
    return int(e.value.response.headers["retry-after"])


def test_requests_per_minute(server: Server) -> None:
    client = sdk(server, KEYS["rpm"][0])
    client.models.list()
    client.models.list()
    with pytest.raises(openai.RateLimitError) as e:
        client.models.list()
    assert e.value.status_code == 429 and e.value.code == "rate_limit_exceeded" and _retry_after(e) >= 1
    assert "requests per minute" in e.value.message and KEYS["rpm"][0] not in e.value.message
    assert sdk(server, TEAM_A).models.list().data  # another key is not affected


def test_rate_limits_over_kserve_http_and_grpc(server: Server) -> None:
    http, key = http_client(server), bearer(KEYS["http-rpm"][0])
    http.get_model_metadata("add_sub", headers=key)
    with pytest.raises(InferenceServerException) as e:
        http.get_model_metadata("add_sub", headers=key)
    assert e.value.status() == "429"
    r = httpx.get(server.url + "/v2/models/add_sub", headers=key)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and set(r.json()) == {"error"}
    grpc_, key = grpc_client(server), bearer(KEYS["grpc-rpm"][0])
    grpc_.get_model_metadata("add_sub", headers=key)
    with pytest.raises(InferenceServerException) as e:
        grpc_.get_model_metadata("add_sub", headers=key)
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"


def test_each_request_on_a_grpc_stream_counts(server: Server) -> None:
    client, answers = grpc_client(server), queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)),
                        headers=bearer(KEYS["stream-rpm"][0]))
    try:
        for i in range(3):
            client.async_stream_infer("add_sub", add_sub_inputs(grpcclient), request_id=str(i))
        got = [answers.get(timeout=60) for _ in range(3)]
    finally:
        client.stop_stream()
    errors = [error for _, error in got if error is not None]
    assert len(errors) == 1 and "requests per minute" in str(errors[0])  # 2 a minute: the stream is not one request


def test_concurrent_requests(server: Server) -> None:
    gate, key = server.log_path.parent / "gate", KEYS["conc"][0]
    body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    close_gate(gate)
    with ThreadPoolExecutor(1) as pool:
        try:
            held = pool.submit(httpx.post, server.url + "/v2/models/gated/infer", json=body, headers=bearer(key),
                               timeout=120)
            wait_started(gate)
            with pytest.raises(openai.RateLimitError) as e:
                sdk(server, key).models.list()
            assert _retry_after(e) >= 1 and "concurrent requests" in e.value.message
            text = metrics(server, ADMIN)
            assert metric_value(text, "sluice_key_requests_in_flight", {"key_id": "conc"}) == 1
        finally:
            open_gate(gate)
        assert held.result().status_code == 200
    assert sdk(server, key).models.list().data  # the slot was freed with the response


def test_tokens_per_minute(server: Server) -> None:
    # A key's tokens flow back at 40 a minute (one every 1.5 s). The first request spends the whole
    # minute at once (39 prompt tokens, charged at admission, and 1 generated), so the next one's 20
    # prompt tokens do not fit until 30 s after the first began: one token of generation, not ten,
    # keeps a loaded machine well inside that.
    client = sdk(server, KEYS["tpm"][0])
    out = client.completions.create(model=LLM_NAME, prompt=list(range(100, 139)), max_tokens=1, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == 39 and out.usage.completion_tokens == 1
    with pytest.raises(openai.RateLimitError) as e:  # 40 used; 20 more do not fit
        client.completions.create(model=LLM_NAME, prompt=list(range(100, 120)), max_tokens=10)
    assert _retry_after(e) >= 1 and "tokens per minute" in e.value.message
    text = metrics(server, ADMIN)
    assert metric_value(text, "sluice_key_tokens_total", {"key_id": "tpm", "kind": "prompt"}) == 39
    assert metric_value(text, "sluice_key_tokens_total", {"key_id": "tpm", "kind": "completion"}) == 1
    assert metric_value(text, "sluice_key_rejections_total", {"key_id": "tpm", "reason": "tpm"}) == 1


def test_embeddings_count_their_input_tokens(server: Server) -> None:
    client = sdk(server, KEYS["emb"][0])  # 12 tokens a minute
    n = client.embeddings.create(model=EMBEDDINGS, input="the quick brown fox jumps").usage.prompt_tokens
    assert 6 < n <= 12
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model=EMBEDDINGS, input="the quick brown fox jumps")
    text = metrics(server, ADMIN)
    assert metric_value(text, "sluice_key_tokens_total", {"key_id": "emb", "kind": "prompt"}) == n


def test_per_key_metrics_carry_the_id_never_the_key(server: Server) -> None:
    sdk(server, TEAM_A).models.list()
    text = metrics(server, ADMIN)
    assert (metric_value(text, "sluice_key_requests_total", {"key_id": "team-a"}) or 0) >= 1
    assert (metric_value(text, "sluice_auth_failures_total", {"access": "api"}) or 0) >= 1
    assert metric_value(text, "sluice_quota_redis_up") == 0  # no Redis: quotas are this replica's own
    for key in [ADMIN, LEGACY_ADMIN, INVALID, *(k for k, _ in KEYS.values())]:
        assert key not in text


# -- last: what the log shows -----------------------------------------------------------------------------------------
def test_the_log_has_access_lines_and_no_keys_or_prompts(server: Server) -> None:
    prompt = f"zebra quartz {secrets.token_hex(8)}"
    sdk(server, TEAM_A).chat.completions.create(model=LLM_NAME, max_tokens=2,
                                                messages=[{"role": "user", "content": prompt}])
    with pytest.raises(openai.AuthenticationError):
        sdk(server, INVALID).chat.completions.create(model=LLM_NAME, messages=[{"role": "user", "content": prompt}])
    r = httpx.post(f"{server.url}/v2/models/{LLM_NAME}/generate", headers=bearer(TEAM_A), timeout=120,
                   json={"text_input": prompt, "parameters": {"max_tokens": 2}})
    assert r.status_code == 200, r.text
    with pytest.raises(InferenceServerException):
        grpc_client(server).infer("add_sub", add_sub_inputs(grpcclient), headers=bearer(INVALID))
    log = server.log()
    assert "sluice.access: POST /v1/chat/completions 200" in log
    assert "sluice.access: POST /v1/chat/completions 401" in log
    assert f"sluice.access: POST /v2/models/{LLM_NAME}/generate 200" in log
    for key in [ADMIN, LEGACY_ADMIN, INVALID, *(k for k, _ in KEYS.values())]:
        assert key not in log and key[-24:] not in log
    assert prompt not in log and prompt.split()[-1] not in log
