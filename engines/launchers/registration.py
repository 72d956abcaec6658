"""Register a worker with a running gateway and remove it on shutdown.

Routes (implemented by the gateway): ``POST {gateway}/v1/admin/workers`` with the
JSON below, and ``DELETE {gateway}/v1/admin/workers/{name}``. A bearer token comes
from ``$SLUICE_ADMIN_KEY`` when set.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)


def _headers() -> dict[str, str]:
    key = os.environ.get("SLUICE_ADMIN_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def worker_record(*, name: str, url: str, models: list[str], engine: str, block_size: int | None,
                  kv_events_endpoint: str | None, kv_events_replay_endpoint: str | None,
                  tokenizer: str | None = None) -> dict[str, Any]:
    """The registration body. For vLLM the KV endpoints are ZMQ ``tcp://`` URLs; for
    TensorRT-LLM the events endpoint is the worker's ``http://.../kv_cache_events``.
    `tokenizer` (a path or repository model name) lets the gateway load the model's own
    tokenizer when the served model id is neither."""
    return {"name": name, "url": url, "models": models, "engine": engine, "block_size": block_size,
            "kv_events_endpoint": kv_events_endpoint, "kv_events_replay_endpoint": kv_events_replay_endpoint,
            "tokenizer": tokenizer}


def register(gateway: str, record: dict[str, Any], attempts: int = 10, delay_s: float = 1.0) -> None:
    """POST the record; retries while the gateway is unreachable or 5xx, raises RuntimeError after."""
    url = gateway.rstrip("/") + "/v1/admin/workers"
    last = "no attempt"
    for attempt in range(attempts):
        try:
            response = httpx.post(url, json=record, headers=_headers(), timeout=10.0)
            if response.status_code < 300:
                log.info("registered worker %s with %s", record["name"], gateway)
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code < 500:
                break  # refused (bad key, bad record): retrying will not help
        except httpx.HTTPError as exc:
            last = repr(exc)
        if attempt + 1 < attempts:
            time.sleep(delay_s)
    raise RuntimeError(f"could not register worker {record['name']} with {gateway}: {last}")


def deregister(gateway: str, name: str) -> None:
    """DELETE the worker; failures are logged, never raised (we are shutting down anyway)."""
    url = gateway.rstrip("/") + f"/v1/admin/workers/{name}"
    try:
        response = httpx.delete(url, headers=_headers(), timeout=10.0)
        if response.status_code >= 300 and response.status_code != 404:
            log.warning("deregistering %s: HTTP %d", name, response.status_code)
    except httpx.HTTPError as exc:
        log.warning("deregistering %s failed: %r", name, exc)
