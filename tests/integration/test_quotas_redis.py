"""Per-key quotas shared by two real gateway replicas through one real redis-server.

What a key spends on replica A (requests, a held concurrency slot, tokens),
replica B sees. With redis-server stopped, the replicas keep serving and enforce
the limits locally; when it comes back (empty, on the same port), they share
quotas again.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.kserve_support import wait_for
from tests.integration.security_support import (
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
from tests.redis_server import HAVE_REDIS, RedisServer
from tests.servers import LLM_NAME, Server, metric_value, start_server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed (make apt)")]

KEYS: dict[str, tuple[str, dict[str, int]]] = {
    "ops": (new_key("ops"), {}),
    "rpm": (new_key("rpm"), {"rpm": 2}),
    "conc": (new_key("conc"), {"concurrency": 1}),
    "tpm": (new_key("tpm"), {"tpm": 40}),
    "outage": (new_key("outage"), {"rpm": 2}),
    "after": (new_key("after"), {"rpm": 2}),
}
OPS = KEYS["ops"][0]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    started: list[Server] = []
    try:
        for name in ("a", "b"):
            tmp = tmp_path_factory.mktemp(f"replica-{name}")
            repo, _ = secured_repository(tmp)
            keys = write_keys(tmp / "keys.yaml", KEYS)
            started.append(start_server(["--model-repository", str(repo), "--api-keys-file", str(keys),
                                         "--redis-url", redis_server.url], tmp / "server.log"))
        yield started[0], started[1]
    finally:
        for srv in started:
            srv.stop()


def gate_of(server: Server) -> Path:
    return server.log_path.parent / "gate"


def test_requests_per_minute_are_shared(replicas: tuple[Server, Server]) -> None:
    a, b = replicas
    key = KEYS["rpm"][0]
    sdk(a, key).models.list()
    sdk(a, key).models.list()
    with pytest.raises(openai.RateLimitError) as e:
        sdk(b, key).models.list()
    assert int(e.value.response.headers["retry-after"]) >= 1 and "requests per minute" in e.value.message


def test_a_concurrency_slot_held_on_one_replica_counts_on_the_other(replicas: tuple[Server, Server]) -> None:
    a, b = replicas
    gate, key = gate_of(a), KEYS["conc"][0]
    body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    close_gate(gate)
    with ThreadPoolExecutor(1) as pool:
        try:
            held = pool.submit(httpx.post, a.url + "/v2/models/gated/infer", json=body, headers=bearer(key),
                               timeout=120)
            wait_started(gate)
            with pytest.raises(openai.RateLimitError) as e:
                sdk(b, key).models.list()
            assert int(e.value.response.headers["retry-after"]) >= 1 and "concurrent requests" in e.value.message
        finally:
            open_gate(gate)
        assert held.result().status_code == 200

    def b_admits() -> bool:  # A frees the slot in Redis just after its response
        try:
            sdk(b, key).models.list()
        except openai.RateLimitError:
            return False
        return True

    wait_for(b_admits, "the slot to be freed")


def test_tokens_are_shared(replicas: tuple[Server, Server]) -> None:
    a, b = replicas
    key, prompt = KEYS["tpm"][0], list(range(200, 220))
    out = sdk(a, key).completions.create(model=LLM_NAME, prompt=prompt, max_tokens=15, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens + out.usage.completion_tokens == 35  # of 40 a minute
    refusals = []
    # A charges the completion just after its response, so B may still admit the first try. B's own
    # two tries cost at most 2 x (12 + 1) = 26 <= 40: a refusal means B counts A's tokens.
    for _ in range(2):
        try:
            sdk(b, key).completions.create(model=LLM_NAME, prompt=prompt[:12], max_tokens=1)
        except openai.RateLimitError as e:
            refusals.append(e)
            break
    assert refusals, "B never saw A's tokens"
    assert "tokens per minute" in refusals[0].message and int(refusals[0].response.headers["retry-after"]) >= 1


def test_redis_outage_falls_back_to_local_quotas_and_recovers(replicas: tuple[Server, Server],
                                                              redis_server: RedisServer) -> None:
    a, b = replicas
    assert metric_value(metrics(a, OPS), "sluice_quota_redis_up") == 1
    redis_server.kill()
    try:
        key = KEYS["outage"][0]
        sdk(a, key).models.list()  # served, on local quotas
        sdk(a, key).models.list()
        with pytest.raises(openai.RateLimitError):  # and the limit holds, on this replica alone
            sdk(a, key).models.list()
        text = metrics(a, OPS)
        assert metric_value(text, "sluice_quota_redis_up") == 0
        assert (metric_value(text, "sluice_quota_redis_fallbacks_total") or 0) >= 1
        assert "quotas: Redis unreachable" in a.log()
    finally:
        redis_server.start()  # same port, empty

    def shared_again() -> bool:
        return all(metric_value(metrics(s, OPS), "sluice_quota_redis_up") == 1 for s in (a, b))

    wait_for(shared_again, "both replicas to use Redis again")
    key = KEYS["after"][0]
    sdk(a, key).models.list()
    sdk(a, key).models.list()
    with pytest.raises(openai.RateLimitError):
        sdk(b, key).models.list()
