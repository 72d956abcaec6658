"""Talking to one chosen frontend of `sluice serve --frontends N`.

The kernel spreads new connections over the frontends (SO_REUSEPORT), so a client cannot pick
one. Every response names the frontend that answered it (`X-Sluice-Frontend`): a connection is
opened, asked `/health`, and kept for the request only if the right frontend answered; otherwise
it is closed and another one opened. The request then goes on that same connection at once, well
within any keep-alive timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

FRONTEND = "x-sluice-frontend"


@contextmanager
def connection_to(url: str, frontend: int, timeout_s: float = 120.0) -> Iterator[httpx.Client]:
    """A client whose one connection reached `frontend` (bounded: a frontend being restarted answers later)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        client = httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=1))
        try:
            reached = client.get("/health").headers.get(FRONTEND) == str(frontend)
        except httpx.TransportError:
            reached = False
        if reached:
            try:
                yield client
            finally:
                client.close()
            return
        client.close()
        time.sleep(0.02)
    raise AssertionError(f"no connection reached frontend {frontend} within {timeout_s:.0f} s")


def on(url: str, frontend: int, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request answered by `frontend` (checked)."""
    with connection_to(url, frontend) as client:
        r = client.request(method, path, **kwargs)
    assert r.headers.get(FRONTEND) == str(frontend), r.headers
    return r


@contextmanager
def stream_on(url: str, frontend: int, body: dict[str, Any], headers: dict[str, str]) -> Iterator[httpx.Response]:
    """A streamed completion held open on `frontend` (its response headers read: it was dispatched)."""
    with connection_to(url, frontend) as client, \
            client.stream("POST", "/v1/completions", json={**body, "stream": True}, headers=headers) as r:
        assert r.status_code == 200 and r.headers.get(FRONTEND) == str(frontend), r.headers
        yield r


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """name's samples of a merged exposition, by their sorted labels (`frontend` included)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


