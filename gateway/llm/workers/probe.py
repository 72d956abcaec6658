"""What a worker says about itself: its model cards (`/v1/models`) and its KV-event sources.

Both are read once, when a worker is registered: vLLM reports `max_model_len` per model
on `/v1/models`, and its publisher's endpoints on `/kv_event_sources`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import httpx

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord


async def model_cards(url: str) -> dict[str, dict[str, Any]]:
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(url.rstrip("/") + "/v1/models")
    except httpx.HTTPError as e:
        raise SluiceError(f"worker {url} is unreachable: {e!r}", ErrorKind.UNAVAILABLE, retryable=True) from None
    if r.status_code != 200:
        raise SluiceError(f"worker {url} answered {r.status_code} on /v1/models", ErrorKind.UNAVAILABLE)
    return {m["id"]: m for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m}


def context_length(card: dict[str, Any]) -> int:
    """vLLM reports `max_model_len`; a worker that does not is assumed to take 2,048 tokens."""
    value = card.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 24 else 2048


async def discover_kv_events(record: WorkerRecord) -> WorkerRecord:
    """Fill in a vLLM worker's KV-event endpoints from its `/kv_event_sources`, if it has them."""
    if record.kv_events_endpoint or record.engine != "vllm":
        return record
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(record.url.rstrip("/") + "/kv_event_sources")
        cfg = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return record
    # vLLM answers {dp_rank: KVEventsConfig}; rank 0 is the one a single-rank worker has.
    if isinstance(cfg, dict) and "endpoint" not in cfg and cfg:
        cfg = cfg.get("0") or next(iter(cfg.values()))
    if isinstance(cfg, list):
        cfg = cfg[0] if cfg else {}
    if isinstance(cfg, dict) and not cfg.get("enable_kv_cache_events", True):
        return record
    endpoint = cfg.get("endpoint") if isinstance(cfg, dict) else None
    if not endpoint or "*" not in str(endpoint):
        return record  # a concrete host means vLLM connects out: the router would have to bind
    host = urlparse(record.url).hostname or "127.0.0.1"
    replay = cfg.get("replay_endpoint")
    return record.model_copy(update={
        "kv_events_endpoint": str(endpoint).replace("*", host),
        "kv_events_replay_endpoint": str(replay).replace("*", host) if replay else None})
