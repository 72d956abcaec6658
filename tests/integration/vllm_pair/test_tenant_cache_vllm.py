"""Tenants' prefix caches are isolated, on a real vLLM worker (issue 20, item 8).

Two gateways share one real vLLM worker and one keys file: `a1` and `a2` are keys of
tenant `team-a`, `b` is a tenant of its own. Gateway 1 sends the requests that fill the
cache; gateway 2 has dispatched nothing of them, so what it predicts for a prompt comes
from vLLM's KV events alone, which checks that the router's salted hashes are the ones
vLLM publishes for salted requests. vLLM's own `prompt_tokens_details.cached_tokens` says
whether the engine served a prefix from cache.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import openai
import pytest
import yaml

from gateway.security.tenancy import CacheNamespaces
from tests.integration.conftest import BLOCK, MODEL, Worker, gateway_over
from tests.integration.security_support import metrics, new_key
from tests.servers import Server, metric_value

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

KEYS = {"a1": new_key("a1"), "b": new_key("b"), "a2": new_key("a2")}
TENANTS = {"a1": "team-a", "a2": "team-a"}


@pytest.fixture(scope="module")
def gateways(workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    tmp = tmp_path_factory.mktemp("tenants")
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"id": kid, "key": key, **({"tenant": TENANTS[kid]} if kid in TENANTS else {})}
                                    for kid, key in KEYS.items()]))
    started: list[Server] = []
    try:
        for name in ("g1", "g2"):
            (tmp / name).mkdir()
            started.append(gateway_over(workers[:1], tmp / name, "--api-keys-file", str(keys)))
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _chat(server: Server, kid: str, text: str, **extra: object) -> tuple[int, int, int]:
    """(predicted cached tokens, vLLM's cached tokens, prompt tokens) of one chat."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS[kid], max_retries=0, timeout=300)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], temperature=0, max_tokens=2,
        extra_body=extra or None)
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return int(raw.headers["x-sluice-predicted-cached-tokens"]), cached, usage.prompt_tokens


def _indexed(server: Server, worker: str) -> float:
    return metric_value(metrics(server, KEYS["a1"]), "sluice_router_index_blocks", {"worker": worker}) or 0.0


def _wait_indexed(server: Server, worker: str, at_least: float) -> None:
    deadline = time.monotonic() + 60
    while _indexed(server, worker) < at_least:
        assert time.monotonic() < deadline, "the KV events of gateway 1's request never reached gateway 2"
        time.sleep(0.2)


def _prompt() -> str:
    nonce = secrets.token_hex(8)  # a prefix no other test (or earlier run) has cached
    return f"Ticket {nonce}. " + " ".join(
        f"Clause {i}: the lessee of unit {i} shall return the keys of storeroom {i * 3} before noon."
        for i in range(30))


def test_a_tenant_hits_only_its_own_namespace(gateways: tuple[Server, Server], workers: list[Worker]) -> None:
    g1, g2 = gateways
    worker = workers[0].name
    # Gateway 2 hears the worker's events: a first request's blocks reach its index.
    before = _indexed(g2, worker)
    _chat(g1, "a1", _prompt())
    _wait_indexed(g2, worker, before + 1)

    text = _prompt()
    before = _indexed(g2, worker)
    _, first_cached, prompt_tokens = _chat(g1, "a1", text)
    blocks = prompt_tokens // BLOCK
    assert blocks >= 3 and first_cached == 0, (prompt_tokens, first_cached)
    _wait_indexed(g2, worker, before + blocks)

    # Tenant b, same prompt: nothing predicted, nothing served from a's cache (on both gateways).
    assert _chat(g2, "b", text)[:2] == (0, 0)
    # A client salt cannot pick a's namespace, not even the salt the gateway derives for team-a.
    a_salt = CacheNamespaces({"a1": "team-a"}).salt("a1")
    assert _chat(g1, "b", text, cache_salt=a_salt)[:2] == (0, 0)

    # a's groupmate hits a's cache; gateway 2 predicts it from vLLM's events alone.
    predicted, cached, _ = _chat(g2, "a2", text)
    assert cached >= (blocks - 1) * BLOCK, cached
    assert abs(predicted - cached) <= BLOCK, (predicted, cached)
    predicted, cached, _ = _chat(g1, "a1", text)
    assert cached >= (blocks - 1) * BLOCK and abs(predicted - cached) <= BLOCK, (predicted, cached)
