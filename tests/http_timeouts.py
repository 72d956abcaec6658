"""httpx's module-level calls (`httpx.get`, `httpx.post`, `httpx.stream`...) default to a 5 s
timeout. A test that leaves it out holds a wall-clock bound without saying so: on a busy
machine (a CI runner, a CPU burner on every core) a 2-token chat on the in-process engine can
take longer, and the test fails for the machine, not the product. `install` makes the default
`TEST_TIMEOUT` for calls that give none; a call that names its own timeout keeps it, and the
product's own httpx calls, which always name theirs, are untouched."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import httpx

TEST_TIMEOUT = httpx.Timeout(180.0, connect=30.0)
_CALLS = ("request", "stream", "get", "options", "head", "post", "put", "patch", "delete")


def _patient(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def with_default(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", TEST_TIMEOUT)
        return call(*args, **kwargs)

    with_default.__sluice_patient__ = True  # type: ignore[attr-defined]
    return with_default


def install() -> None:
    for name in _CALLS:
        call = getattr(httpx, name)
        if not getattr(call, "__sluice_patient__", False):
            setattr(httpx, name, _patient(call))
