"""What a worker says about itself: its model cards (`/v1/models`), its KV-event sources, its capacity.

All are read once, when a worker is registered: vLLM reports `max_model_len` per model
on `/v1/models`, its publisher's endpoints on `/kv_event_sources`, and (in dev mode) its
scheduler's `max_num_seqs` on `/server_info`; the sim puts `max_num_seqs` on its model card. Every
request carries the gateway's worker key; a worker that refuses it is an error naming the refusal, at once
(not a worker still starting, which is retried).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import httpx

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord

KEY_REFUSED = "worker_key_refused"  # SluiceError.code of a worker that refused the gateway's worker key


def _headers(worker_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {worker_key}"} if worker_key else {}


async def model_cards(url: str, worker_key: str | None = None) -> dict[str, dict[str, Any]]:
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(url.rstrip("/") + "/v1/models", headers=_headers(worker_key))
    except httpx.HTTPError as e:
        raise SluiceError(f"worker {url} is unreachable: {e!r}", ErrorKind.UNAVAILABLE, retryable=True) from None
    if r.status_code in (401, 403):
        fix = ("the key this gateway sends (--worker-key-file, SLUICE_WORKER_KEY) is not the worker's"
               if worker_key else "this gateway has none: set --worker-key-file or SLUICE_WORKER_KEY")
        raise SluiceError(f"worker {url} refused the gateway's worker key (HTTP {r.status_code} on /v1/models): "
                          f"{fix}", ErrorKind.UNAVAILABLE, code=KEY_REFUSED)
    if r.status_code != 200:
        raise SluiceError(f"worker {url} answered {r.status_code} on /v1/models", ErrorKind.UNAVAILABLE)
    return {m["id"]: m for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m}


def context_length(card: dict[str, Any]) -> int:
    """vLLM reports `max_model_len`; a worker that does not is assumed to take 2,048 tokens."""
    value = card.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 24 else 2048


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 20 else None


async def engine_capacity(record: WorkerRecord, cards: dict[str, dict[str, Any]],
                          worker_key: str | None = None) -> int | None:
    """The requests a worker runs at once, if it says: the record's `capacity`; else `max_num_seqs`
    on its model card (the sim); else, for vLLM, the scheduler's on `/server_info` (served only with
    VLLM_SERVER_DEV_MODE=1). None: unknown (gateway.llm.capacity's default applies)."""
    if record.capacity is not None:
        return record.capacity
    for card in cards.values():
        if (seqs := _positive(card.get("max_num_seqs"))) is not None:
            return seqs
    if record.engine != "vllm":
        return None
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(record.url.rstrip("/") + "/server_info", params={"config_format": "json"},
                               headers=_headers(worker_key))
        info = r.json() if r.status_code == 200 else {}
        return _positive(info["vllm_config"]["scheduler_config"]["max_num_seqs"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


async def discover_kv_events(record: WorkerRecord, worker_key: str | None = None) -> WorkerRecord:
    """Fill in a vLLM worker's KV-event endpoints from its `/kv_event_sources`, if it has them."""
    if record.kv_events_endpoint or record.engine != "vllm":
        return record
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(record.url.rstrip("/") + "/kv_event_sources", headers=_headers(worker_key))
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
    endpoint = str(cfg.get("endpoint") or "") if isinstance(cfg, dict) else ""
    # vLLM binds its PUB socket when the endpoint holds "*" or "::" (the launcher spells one
    # address IPv4-mapped, tcp://[::ffff:a.b.c.d]:port); otherwise it connects out, and the
    # router would have to bind. Its replay socket always binds.
    if not endpoint.startswith("tcp://") or ("*" not in endpoint and "::" not in endpoint):
        return record
    host = urlparse(record.url).hostname or "127.0.0.1"
    replay = str(cfg.get("replay_endpoint") or "")
    return record.model_copy(update={
        "kv_events_endpoint": _at_host(endpoint, host),
        "kv_events_replay_endpoint": _at_host(replay, host) if replay.startswith("tcp://") else None})


def _at_host(endpoint: str, host: str) -> str:
    """The bound `endpoint`'s port on the worker's own `host` (the one its URL names)."""
    port = endpoint.rpartition(":")[2]
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
