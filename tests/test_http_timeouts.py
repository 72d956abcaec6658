"""tests/http_timeouts.py: httpx's module-level calls get the suite's patient timeout when they name
none, and keep their own when they do."""

from __future__ import annotations

import httpx

from tests.http_timeouts import TEST_TIMEOUT


def _seen_timeout(**kwargs: object) -> httpx.Timeout:
    seen: list[httpx.Timeout] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(httpx.Timeout(**request.extensions["timeout"]))
        return httpx.Response(204)

    # httpx.request builds its own Client; give it a transport that records the timeout it was sent with.
    original = httpx.Client.__init__

    def init(self: httpx.Client, *args: object, **kw: object) -> None:
        kw["transport"] = httpx.MockTransport(handler)
        original(self, *args, **kw)  # type: ignore[arg-type]

    httpx.Client.__init__ = init  # type: ignore[method-assign]
    try:
        httpx.get("http://test.invalid/", **kwargs)  # type: ignore[arg-type]
    finally:
        httpx.Client.__init__ = original  # type: ignore[method-assign]
    return seen[0]


def test_a_call_without_a_timeout_gets_the_patient_one() -> None:
    assert _seen_timeout() == TEST_TIMEOUT


def test_a_call_with_its_own_timeout_keeps_it() -> None:
    assert _seen_timeout(timeout=2.5) == httpx.Timeout(2.5)
