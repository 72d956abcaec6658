"""Register a worker with a running gateway, keep it registered, and remove it on shutdown.

Routes (implemented by the gateway): ``POST {gateway}/v1/admin/workers`` with the
JSON below, ``GET`` and ``DELETE {gateway}/v1/admin/workers/{name}``. The caller passes the
bearer token, the gateway's registration key (``$SLUICE_REGISTRATION_KEY``: the
``workers`` scope alone, never a full admin key), or None for none.

`Keeper` is what `sluice worker` runs beside its engine: a gateway that is down, restarting or
refusing the record never costs the engine its life (a LeaderWorkerSet would reload a whole
multi-node group for it). It retries with capped, jittered back-off, and re-registers when a
gateway that restarted without shared state has forgotten the worker.

`source` (the worker's own --host address, when it names one) is the address the calls leave from.
A registration key may register only a worker whose URL host is the caller's own address, and on
a node with several addresses (or several loopback "pods", as in the Ray smoke test) the route
would otherwise pick another one.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import threading
import time
from typing import Annotated, Literal, get_args

import httpx
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 10.0  # each call to the gateway; shutdown waits at most two (tests/deploy: the grace period)


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
    # The engine orders its queue by request priority (vLLM --scheduling-policy priority): the gateway
    # then sends each request's class as vLLM's `priority`.
    priority_scheduling: bool = False


def registration_source(host: str, public_host: str) -> str | None:
    """The address registration calls leave from: the worker's --host when it is one address (not a
    wildcard) and is also the address the worker registers under; else None, the route's choice."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return host if not address.is_unspecified and host == public_host else None


def _client(source: str | None) -> httpx.Client:
    """A client whose connections leave from `source` (None: wherever the route says)."""
    transport = httpx.HTTPTransport(local_address=source) if source else None
    return httpx.Client(transport=transport, timeout=HTTP_TIMEOUT_S)


def register(gateway: str, record: WorkerRecord, key: str | None, attempts: int = 10,
             delay_s: float = 1.0, source: str | None = None) -> None:
    """POST the record; retries while the gateway is unreachable or 5xx, raises RuntimeError after."""
    url = gateway.rstrip("/") + "/v1/admin/workers"
    last = "no attempt"
    for attempt in range(attempts):
        try:
            with _client(source) as client:
                response = client.post(url, json=record.model_dump(mode="json"), headers=_headers(key))
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


def deregister(gateway: str, name: str, key: str | None, source: str | None = None) -> None:
    """DELETE the worker; failures are logged, never raised (we are shutting down anyway)."""
    url = gateway.rstrip("/") + f"/v1/admin/workers/{name}"
    try:
        with _client(source) as client:
            response = client.delete(url, headers=_headers(key))
        if response.status_code >= 300 and response.status_code != 404:
            log.warning("deregistering %s: HTTP %d", name, response.status_code)
    except httpx.HTTPError as exc:
        log.warning("deregistering %s failed: %r", name, exc)


class Keeper:
    """Registers `record` with `gateway` on a daemon thread until `stop()`, then deregisters.

    Attempts back off from `base_s`, doubling up to `cap_s`, each delay jittered by ±20 % so a
    fleet that lost its gateway does not return in lockstep. Once registered, the list of workers
    is read every `check_s`; a gateway that no longer lists the worker gets the record again."""

    def __init__(self, gateway: str, record: WorkerRecord, key: str | None, *, base_s: float = 1.0,
                 cap_s: float = 60.0, check_s: float = 30.0, source: str | None = None) -> None:
        self.gateway, self.record, self.key, self.source = gateway.rstrip("/"), record, key, source
        self.base_s, self.cap_s, self.check_s = base_s, cap_s, check_s
        self.ever_registered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-registration", daemon=True)

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop trying; deregister if the worker was ever registered (a late registration is undone).
        Takes at most 2 × HTTP_TIMEOUT_S: a call in flight, then the DELETE."""
        self._stop.set()
        self._thread.join(HTTP_TIMEOUT_S)
        if self.ever_registered:
            deregister(self.gateway, self.record.name, self.key, self.source)

    def _run(self) -> None:
        failures = 0
        registered = False  # the gateway is known to list the worker
        while not self._stop.is_set():
            if registered:
                if not self._stop.wait(self.check_s) and not self._listed():
                    log.warning("gateway %s no longer lists worker %s; registering it again", self.gateway,
                                self.record.name)
                    registered = False
                continue
            try:
                register(self.gateway, self.record, self.key, attempts=1, source=self.source)
                registered = self.ever_registered = True
                failures = 0
            except RuntimeError as exc:
                failures += 1
                delay = min(self.cap_s, self.base_s * 2 ** min(failures - 1, 16)) * random.uniform(0.8, 1.2)
                log.warning("%s; the engine keeps serving, next attempt in %.1f s", exc, delay)
                self._stop.wait(delay)

    def _listed(self) -> bool:
        """Whether the gateway lists the worker; True when it cannot say (down, or no such route),
        since registering again then would only replace a live registration."""
        try:
            with _client(self.source) as client:
                response = client.get(f"{self.gateway}/v1/admin/workers", headers=_headers(self.key))
            if response.status_code != 200:
                return True
            return any(row.get("name") == self.record.name for row in response.json().get("data", []))
        except (httpx.HTTPError, ValueError, AttributeError):
            return True
