"""Worker registrations under `--frontends N`: one that reaches a frontend reaches them all.

`POST /v1/admin/workers` (and its DELETE and drain) lands on whichever frontend the kernel gave
the connection. That frontend applies the change as a single server does (gateway.routes.admin),
then `broadcast`s it: it records it in `registrations.json` in the supervisor's private directory
and asks every sibling to apply it too (the channel's `worker` op, gateway.frontends.channel),
which `apply` does in each. The route answers once every sibling has answered (or
`WORKER_TIMEOUT_S` passed), so a worker registered through any frontend is routed to by all of
them when the registration returns. A sibling that could not apply it (one being restarted, a
worker it cannot reach) is named in a warning.

The record is what a frontend that starts later (restarted after it died) reads at start-up
(`restore`), before it listens: it applies every registration and drain the others hold, then
reads the record again and undoes what a sibling removed meanwhile. A
registration also vouches for the worker to Kubernetes discovery (gateway.discovery.attest) in
every frontend, as it does in a single server.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from engines.errors import SluiceError
from engines.launchers.registration import WorkerRecord
from gateway.discovery.attest import Attestations
from gateway.frontends.channel import WORKER_TIMEOUT_S, Peers
from gateway.llm.workers.pool import WorkerPool
from router import Router

log = logging.getLogger("sluice.frontends")
_FILE, _LOCK = "registrations.json", "registrations.lock"


class Fleet(Protocol):
    """What a change applies to (the app's state, gateway.app_state.AppState)."""

    workers: WorkerPool
    attestations: Attestations
    router: Router
    peers: Peers | None


async def apply(state: Fleet, change: dict[str, Any]) -> dict[str, Any]:
    """Apply a registration, removal or drain another frontend took; {"error": ...} if it failed."""
    try:
        action = change["action"]
        if action == "add":
            record = WorkerRecord.model_validate(change["record"])
            models = await state.workers.add(record)
            await state.attestations.vouch(record.name, record.url)
            return {"models": models}
        name = str(change["name"])
        if action == "remove":
            await state.attestations.revoke(name)
            return {"removed": await state.workers.remove(name)}
        if action == "drain":
            state.router.drain(name, bool(change["draining"]))
            return {"draining": bool(change["draining"])}
        return {"error": f"unknown action {action!r}"}
    except SluiceError as e:
        return {"error": e.message}
    except (KeyError, ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
        return {"error": f"{type(e).__name__}: {e}"}


async def broadcast(state: Fleet, change: dict[str, Any]) -> None:
    """After this frontend applied `change`: record it, and have every sibling apply it."""
    peers = state.peers
    if peers is None:
        return
    await asyncio.to_thread(_record, peers.directory, change)
    answers = await peers.ask_all({"op": "worker", **change}, timeout_s=WORKER_TIMEOUT_S)
    for index in range(peers.count):
        if index == peers.index:
            continue
        try:
            error = json.loads(answers[index]).get("error") if index in answers else "no answer"
        except ValueError:
            error = "an answer that could not be read"
        if error:
            log.warning("frontend %d did not apply the worker %s of %s: %s (it applies the record when it "
                        "restarts)", index, change["action"], _name(change), error)


async def restore(state: Fleet, directory: Path) -> None:
    """At start-up: apply the registrations and drains the other frontends recorded."""
    held = await asyncio.to_thread(_read, directory)
    for name, record in held["workers"].items():
        answer = await apply(state, {"action": "add", "record": record})
        if "error" in answer:
            log.warning("registered worker %s not restored: %s", name, answer["error"])
    for name in held["draining"]:
        await apply(state, {"action": "drain", "name": name, "draining": True})
    # A sibling records a change before it broadcasts it: a removal or undrain that reached this
    # frontend while the workers were being added (before it had them) is in the record now.
    now = await asyncio.to_thread(_read, directory)
    for name in held["workers"].keys() - now["workers"].keys():
        await apply(state, {"action": "remove", "name": name})
    for name in set(held["draining"]) - set(now["draining"]) - (held["workers"].keys() - now["workers"].keys()):
        await apply(state, {"action": "drain", "name": name, "draining": False})


def _name(change: dict[str, Any]) -> str:
    return str(change.get("name") or change.get("record", {}).get("name", "?"))


def _read(directory: Path) -> dict[str, Any]:
    try:
        held = json.loads((directory / _FILE).read_text())
    except FileNotFoundError:
        return {"workers": {}, "draining": []}
    return {"workers": dict(held.get("workers", {})), "draining": list(held.get("draining", []))}


def _record(directory: Path, change: dict[str, Any]) -> None:
    """Read, change and replace the record, under a lock the frontends share."""
    with open(directory / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = _read(directory)
        workers, draining = held["workers"], set(held["draining"])
        name = _name(change)
        if change["action"] == "add":
            workers[name] = change["record"]
        elif change["action"] == "remove":
            workers.pop(name, None)
            draining.discard(name)
        elif change["draining"]:
            draining.add(name)
        else:
            draining.discard(name)
        tmp = directory / f"{_FILE}.{os.getpid()}"
        tmp.write_text(json.dumps({"workers": workers, "draining": sorted(draining)}))
        os.replace(tmp, directory / _FILE)
