"""A restarted frontend's `restore` (gateway.frontends.registrations) against the record as its
siblings change it meanwhile: a removal that reached it before it had added the worker must not
leave the worker routed to by it alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.frontends import registrations


class _Pool:
    def __init__(self) -> None:
        self.names: set[str] = set()

    async def add(self, record: Any) -> list[str]:
        self.names.add(record.name)
        return list(record.models)

    async def remove(self, name: str) -> bool:
        if name not in self.names:
            return False
        self.names.discard(name)
        return True


class _Attestations:
    async def vouch(self, name: str, url: str) -> None: ...

    async def revoke(self, name: str) -> None: ...


class _Router:
    def __init__(self) -> None:
        self.draining: set[str] = set()

    def drain(self, name: str, draining: bool) -> None:
        (self.draining.add if draining else self.draining.discard)(name)


class _Fleet:
    def __init__(self) -> None:
        self.workers, self.attestations, self.router, self.peers = _Pool(), _Attestations(), _Router(), None


def _write(directory: Path, workers: list[str], draining: list[str]) -> None:
    records = {n: {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": ["m"]} for i, n in enumerate(workers)}
    (directory / "registrations.json").write_text(json.dumps({"workers": records, "draining": draining}))


async def test_a_removal_recorded_while_restoring_is_applied_after_the_adds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, ["w0", "w1", "w2"], ["w2"])
    fleet = _Fleet()
    real_apply = registrations.apply

    async def apply(state: Any, change: dict[str, Any]) -> dict[str, Any]:
        answer = await real_apply(state, change)
        if change.get("record", {}).get("name") == "w0":
            # Meanwhile a sibling removed w1 and undrained w2: it recorded that, and its broadcast
            # reached this frontend before it had w1 (the removal found nothing to remove).
            _write(tmp_path, ["w0", "w2"], [])
            assert await real_apply(state, {"action": "remove", "name": "w1"}) == {"removed": False}
        return answer

    monkeypatch.setattr(registrations, "apply", apply)
    await registrations.restore(fleet, tmp_path)  # type: ignore[arg-type]
    assert fleet.workers.names == {"w0", "w2"} and fleet.router.draining == set()
