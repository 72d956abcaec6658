"""Register a worker with a running gateway and remove it on shutdown.

Routes (implemented by the gateway): ``POST {gateway}/v1/admin/workers`` with the
JSON below, and ``DELETE {gateway}/v1/admin/workers/{name}``. The caller passes the
bearer token, the gateway's registration key (``$SLUICE_REGISTRATION_KEY``: the
``workers`` scope alone, never a full admin key), or None for none.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Literal, get_args

import httpx
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


# Which engines a worker may declare; the gateway maps each to a client dialect.
WorkerEngine = Literal["vllm", "trtllm", "transformers", "sim", "sluice", "openai"]
WORKER_ENGINES: tuple[str, ...] = get_args(WorkerEngine)
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
_Text = Annotated[str, Field(min_length=1, max_length=2048)]


class WorkerRecord(BaseModel):
    """A worker as the gateway knows it from outside: the body of `POST /v1/admin/workers`,
    one entry of `--workers-file`, and what `sluice worker` registers with.

    For vLLM the KV endpoints are ZMQ `tcp://` URLs; for TensorRT-LLM the events
    endpoint is the worker's `http://.../kv_cache_events`. `tokenizer` (a path or a
    repository model name) lets the gateway load the model's own tokenizer when the
    served model id is neither. `capacity` sizes the model's admission (gateway.llm.capacity).
    Unknown fields are refused: a typo must not pass silently."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=_NAME)  # stable: metrics and X-Sluice-Worker
    url: str = Field(max_length=2048, pattern=r"^https?://[^\s/]+")
    models: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = Field(default=(), max_length=64)
    engine: WorkerEngine = "vllm"
    block_size: int | None = Field(default=None, ge=1, le=1 << 20)
    kv_events_endpoint: _Text | None = None
    kv_events_replay_endpoint: _Text | None = None
    tokenizer: _Text | None = None
    # Requests the engine runs at once (vLLM max_num_seqs, TensorRT-LLM max_batch_size, the sim's
    # max_num_seqs). None: read from the worker if it says, else the gateway's stated default.
    capacity: int | None = Field(default=None, ge=1, le=1 << 20)


def register(gateway: str, record: WorkerRecord, key: str | None, attempts: int = 10,
             delay_s: float = 1.0) -> None:
    """POST the record; retries while the gateway is unreachable or 5xx, raises RuntimeError after."""
    url = gateway.rstrip("/") + "/v1/admin/workers"
    last = "no attempt"
    for attempt in range(attempts):
        try:
            response = httpx.post(url, json=record.model_dump(mode="json"), headers=_headers(key), timeout=10.0)
            if response.status_code < 300:
                log.info("registered worker %s with %s", record.name, gateway)
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code < 500:
                break  # refused (bad key, bad record): retrying will not help
        except httpx.HTTPError as exc:
            last = repr(exc)
        if attempt + 1 < attempts:
            time.sleep(delay_s)
    raise RuntimeError(f"could not register worker {record.name} with {gateway}: {last}")


def deregister(gateway: str, name: str, key: str | None) -> None:
    """DELETE the worker; failures are logged, never raised (we are shutting down anyway)."""
    url = gateway.rstrip("/") + f"/v1/admin/workers/{name}"
    try:
        response = httpx.delete(url, headers=_headers(key), timeout=10.0)
        if response.status_code >= 300 and response.status_code != 404:
            log.warning("deregistering %s: HTTP %d", name, response.status_code)
    except httpx.HTTPError as exc:
        log.warning("deregistering %s failed: %r", name, exc)
