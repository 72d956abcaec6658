"""`--frontends N`: what one frontend process asks its siblings.

With N frontends, N copies of the server share the HTTP and gRPC ports (SO_REUSEPORT): the
kernel spreads connections over them, and each runs its own models, batchers and metrics
(`gateway.frontends.supervisor`). A scrape or a statistics request reaches one of them, so that one asks
the others and answers for all: Prometheus metrics with a `frontend` label on every sample
(`sum()` over it gives the server's totals), Triton statistics summed per model version.

Siblings talk over Unix sockets in a directory the supervisor made for them (mode 0700), which
nothing on the network can reach. One request per connection: a JSON line in, a 4-byte
big-endian length and that many bytes out. Ops: `metrics` (this process's exposition, in the
format the scraper's `accept` header chose: OpenMetrics, with exemplars, or Prometheus text),
`stats` (snapshots of one name/version, or the error) and `worker` (a worker registration,
removal or drain another frontend took, applied here too: gateway.frontends.registrations). A
sibling that does not answer within `TIMEOUT_S` (`WORKER_TIMEOUT_S` for `worker`, which probes
the worker; one being restarted, say) is left out of that answer, and a warning is logged.
What routing needs from the siblings travels on sockets of its own (router.replicas.node_state).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from engines.classic.errors import InferError
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.names import check_model_name
from engines.classic.stats import StatsSnapshot, merge_snapshots, snapshot_from_dict, snapshot_to_dict
from engines.errors import ErrorKind, SluiceError

log = logging.getLogger("sluice.peers")
TIMEOUT_S = 5.0
WORKER_TIMEOUT_S = 60.0  # a sibling applying a registration probes the worker and may load its tokenizer
_MAX_REQUEST_BYTES = 1024 * 1024
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
LABEL = "frontend"


class Peers:
    """This frontend's socket for its siblings, and its questions to them."""

    def __init__(self, directory: Path, index: int, count: int, registry: CollectorRegistry,
                 manager: ModelRepositoryManager | None,
                 on_worker: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.directory, self.index, self.count = directory, index, count
        self._registry, self._manager, self._on_worker = registry, manager, on_worker
        self._server: asyncio.Server | None = None
        self._applying: set[asyncio.Task[dict[str, Any]]] = set()  # registrations a timeout must not cut in two

    def path(self, index: int) -> Path:
        return self.directory / f"frontend-{index}.sock"

    async def start(self) -> None:
        path = self.path(self.index)
        path.unlink(missing_ok=True)  # left by this frontend's previous process
        self._server = await asyncio.start_unix_server(self._serve, path=str(path), limit=_MAX_REQUEST_BYTES)
        os.chmod(path, 0o600)

    async def stop(self) -> None:
        for apply in list(self._applying):  # the process is ending: nothing is left half-served
            apply.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self.path(self.index).unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(TIMEOUT_S):  # a sibling that stops reading holds nothing for long
                request = json.loads(await reader.readline())
            async with asyncio.timeout(WORKER_TIMEOUT_S):
                if isinstance(request, dict) and request.get("op") == "worker" and self._on_worker is not None:
                    # Applied to its end even when the asker stops waiting: cancelled halfway, a
                    # registration would leave models registered with no worker behind them.
                    apply = asyncio.ensure_future(self._on_worker(request))
                    self._applying.add(apply)
                    apply.add_done_callback(self._applying.discard)
                    body = json.dumps(await asyncio.shield(apply)).encode()
                else:
                    body = self._answer(request)
                writer.write(len(body).to_bytes(4, "big") + body)
                await writer.drain()
        except (OSError, ValueError, TimeoutError, asyncio.LimitOverrunError):
            pass  # a sibling that went away; it logs its own side
        except Exception:  # e.g. JSON nested past the recursion limit: still never an unhandled task error
            log.exception("answering a sibling frontend failed")
        finally:
            writer.close()

    def _answer(self, request: Any) -> bytes:
        op = request.get("op") if isinstance(request, dict) else None
        if op == "metrics":
            encoder, _ = choose_encoder(str(request.get("accept", "")))
            return encoder(self._registry)
        if op == "stats" and self._manager is not None:
            try:
                snaps = self._manager.statistics(str(request.get("name", "")), str(request.get("version", "")))
            except SluiceError as e:
                return json.dumps({"error": e.message}).encode()
            return json.dumps({"stats": [snapshot_to_dict(s) for s in snaps]}).encode()
        return json.dumps({"error": f"unknown op {op!r}"}).encode()

    async def _ask(self, index: int, request: dict[str, Any], timeout_s: float) -> bytes | None:
        writer = None
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(self.path(index)))
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                size = int.from_bytes(await reader.readexactly(4), "big")
                if size > _MAX_RESPONSE_BYTES:
                    raise ValueError(f"answer of {size} bytes")
                return await reader.readexactly(size)
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as e:
            log.warning("frontend %d did not answer %s: %s", index, request.get("op"), e or type(e).__name__)
            return None
        finally:
            if writer is not None:
                writer.close()

    async def ask_all(self, request: dict[str, Any], timeout_s: float = TIMEOUT_S) -> dict[int, bytes]:
        """Every sibling's answer, by frontend index; the ones that did not answer are missing."""
        others = [i for i in range(self.count) if i != self.index]
        answers = await asyncio.gather(*(self._ask(i, request, timeout_s) for i in others))
        return {i: a for i, a in zip(others, answers, strict=True) if a is not None}


async def exposition(registry: CollectorRegistry, peers: Peers | None, accept: str = "") -> tuple[bytes, str]:
    """The `/metrics` body and its content type: this process's registry, or every frontend's,
    labelled. OpenMetrics (with the histograms' exemplars) when the scraper's `accept` header asks
    for it, as Prometheus's does; else Prometheus text, which has no exemplars."""
    encoder, content_type = choose_encoder(accept)
    local = encoder(registry)
    if peers is None:
        return local, content_type
    parts = await peers.ask_all({"op": "metrics", "accept": accept})
    parts[peers.index] = local
    return merge_expositions(parts), content_type


async def statistics(manager: ModelRepositoryManager, peers: Peers | None, name: str, version: str
                     ) -> list[StatsSnapshot]:
    """Triton statistics of one version, a model's versions, or every ready one, summed over frontends.
    This process's own answer decides what exists (an unknown model raises here)."""
    if name:
        check_model_name(name)
    local = manager.statistics(name, version)
    if peers is None:
        return local
    parts: dict[tuple[str, str], list[StatsSnapshot]] = {(s.name, s.version): [s] for s in local}
    for index, body in (await peers.ask_all({"op": "stats", "name": name, "version": version})).items():
        try:
            answer = json.loads(body)
            snaps = [snapshot_from_dict(d) for d in answer.get("stats", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InferError(f"frontend {index} sent statistics that could not be read: {e}", ErrorKind.INTERNAL) from e
        for s in snaps:
            if (s.name, s.version) in parts:  # a version only a sibling has is still loading or unloading here
                parts[(s.name, s.version)].append(s)
    return [merge_snapshots(p) for p in parts.values()]


def merge_expositions(parts: dict[int, bytes]) -> bytes:
    """Expositions of several processes (all Prometheus text, or all OpenMetrics) as one: each family
    once, with every process's samples under it, each sample labelled `frontend="<index>"` (an
    exemplar after a sample keeps its own labels). OpenMetrics ends with one `# EOF`."""
    headers: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    eof = False
    for index in sorted(parts):
        family = None
        for line in parts[index].decode("utf-8").split("\n"):
            if not line:
                continue
            if line.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
                family = line.split(" ", 3)[2]
                lines = headers.setdefault(family, [])
                if len(lines) < 3 and line not in lines:
                    lines.append(line)
                samples.setdefault(family, [])
            elif line.startswith("#"):
                eof = eof or line == "# EOF"
            elif family is not None:
                samples[family].append(_labelled(line, index))
    out = [line for family in headers for line in (*headers[family], *samples[family])]
    return ("\n".join([*out, *(["# EOF"] if eof else [])]) + "\n").encode("utf-8")


def _labelled(line: str, index: int) -> str:
    """`name{a="b"} 1.0` -> `name{frontend="2",a="b"} 1.0`; `name 1.0` -> `name{frontend="2"} 1.0`."""
    space, brace = line.find(" "), line.find("{")
    label = f'{LABEL}="{index}"'
    if 0 <= brace < space:
        rest = line[brace + 1:]
        return f"{line[:brace]}{{{label}{'' if rest.startswith('}') else ','}{rest}"
    return f"{line[:space]}{{{label}}}{line[space:]}"
