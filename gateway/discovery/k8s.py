"""Keep a gateway's worker pool in step with Kubernetes EndpointSlices.

`K8sDiscovery(specs, pool)` runs one `SliceWatcher` thread per spec and one supervised
asyncio task that reconciles what the watchers report with `WorkerPool`:

- an endpoint that becomes ready is added with a `WorkerRecord` (the pod's name, its
  URL, the spec's engine and tokenizer; vLLM's KV-event sockets are read from the
  worker) — the same record a self-registering `sluice worker` sends, and a worker
  that already registered itself under the same name and URL is adopted, not replaced.
  Only endpoints whose (name, URL) a worker registered with the registration key are
  added (`attest.Attestations`); the others wait, and a labelled Service alone admits nothing;
- an endpoint that stops being ready, or leaves the slices, is drained (no new
  requests), removed once its in-flight requests finish or after the spec's `drain_s`;
  if it comes back meanwhile it is undrained instead;
- an add that fails (the worker does not answer yet) is retried every `retry_s`.

Only workers this discovery added or adopted are ever removed by it, and a spec
whose watcher has not listed yet removes nothing. The reconcile task and the watcher
threads are supervised: the task is an `engines.supervision.BackgroundTask` (a failure is
logged, counted in `restarts` and restarted after a backoff); a thread that dies is
replaced. Everything but the watcher threads runs on the event loop that called `start()`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from engines.errors import SluiceError
from engines.launchers.registration import WorkerRecord
from engines.supervision import BackgroundTask, Backoff
from gateway.discovery.attest import Attestations
from gateway.discovery.spec import DiscoverySpec
from gateway.discovery.watch import SliceWatcher
from gateway.llm.workers.pool import WorkerPool

log = logging.getLogger("sluice.discovery")


class K8sDiscovery:
    def __init__(self, specs: Sequence[DiscoverySpec], pool: WorkerPool, attestations: Attestations, *,
                 retry_s: float = 2.0, restart_backoff_max_s: float = 30.0) -> None:
        self.specs = list(specs)
        self.pool = pool
        self.attestations = attestations
        self.retry_s = retry_s
        self.synced = asyncio.Event()  # every spec listed once and reconciled: /health may turn ready
        self.watchers: list[SliceWatcher] = []
        self._seen: dict[int, dict[str, str]] = {}  # spec index -> ready worker name -> URL
        self._owned: dict[str, int] = {}  # worker name -> the spec that added it
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self._pending: set[str] = set()  # ready but not added yet (the add failed, or it was being removed)
        self._wanted: dict[str, tuple[str, int]] = {}  # the last pass's ready endpoints: name -> (url, spec)
        self._removing: set[str] = set()
        self._wake = asyncio.Event()
        backoff = Backoff(initial_s=retry_s, max_s=max(retry_s, restart_backoff_max_s))
        # A crash sets the wake-up, so the restarted loop reconciles at once what the dead pass left undone.
        self._reconciler = BackgroundTask("k8s-discovery", self._run, backoff=backoff,
                                          on_crash=lambda _: self._wake.set())
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def restarts(self) -> int:
        """Times the reconcile task died and was restarted."""
        return self._reconciler.restarts.total

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.watchers = [self._watcher(i) for i in range(len(self.specs))]
        self._reconciler.start()

    async def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()
        tasks = list(self._leaving.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(self._reconciler.stop(), *tasks, return_exceptions=True)

    def _watcher(self, index: int) -> SliceWatcher:
        watcher = SliceWatcher(self.specs[index], lambda workers: self._from_thread(index, workers))
        watcher.start()
        return watcher

    def _from_thread(self, index: int, workers: dict[str, str]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._update, index, workers)

    def _update(self, index: int, workers: dict[str, str]) -> None:
        self._seen[index] = workers
        self._wake.set()

    async def _run(self) -> None:
        while True:
            for i, watcher in enumerate(self.watchers):
                if not watcher.alive:
                    log.error("discovery %s: the watcher thread died; starting a new one", watcher.spec.label)
                    self.watchers[i] = self._watcher(i)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.retry_s)
            except TimeoutError:
                if not self._pending:
                    continue
            self._wake.clear()
            await self.reconcile()
            if len(self._seen) == len(self.specs):
                self.synced.set()

    async def reconcile(self) -> None:
        """One pass: add what is ready, drain and remove what left."""
        want: dict[str, tuple[str, int]] = {}
        for index in sorted(self._seen):
            for name, url in self._seen[index].items():
                want.setdefault(name, (url, index))
        for name, (url, index) in want.items():
            await self._arrive(name, url, index)
        for name, (url, index) in self._wanted.items():
            known = self.pool.records.get(name)
            if name not in want and name not in self._owned and known is not None and known.url.rstrip("/") == url:
                # Listed ready, and registered under that name and URL since the last pass (attested),
                # but left before a pass adopted it: it is this discovery's to drain all the same.
                self._owned[name] = index
        self._wanted = want
        for name, index in list(self._owned.items()):
            if name not in want and index in self._seen and name not in self._leaving:
                self._leaving[name] = asyncio.create_task(self._leave(name, index), name=f"drain {name}")
        self._pending &= set(want)

    async def _arrive(self, name: str, url: str, index: int) -> None:
        if name in self._removing:
            self._pending.add(name)
            return
        leaving = self._leaving.pop(name, None)
        if leaving is not None:
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
            self._undrain(name)
        known = self.pool.records.get(name)
        if known is not None and known.url.rstrip("/") == url:
            self._owned[name] = index
            self._pending.discard(name)
            return
        spec = self.specs[index]
        if not await self.attestations.vouched(name, url):
            if name not in self._pending:
                log.warning("discovery %s: endpoint %s at %s is not admitted: no worker registered under that name "
                            "and URL with the registration key", spec.label, name, url)
            self._pending.add(name)
            return
        try:
            record = WorkerRecord(name=name, url=url, engine=spec.engine, tokenizer=spec.tokenizer)  # type: ignore[arg-type]
        except ValueError as exc:  # a name or URL the gateway cannot take; retrying will not help
            log.error("discovery %s: endpoint %s at %s skipped: %s", spec.label, name, url, exc)
            return
        try:
            models = await self.pool.add(record)
        except SluiceError as exc:
            if name not in self._pending:
                log.info("discovery %s: worker %s at %s not added yet: %s", spec.label, name, url, exc.message)
            self._pending.add(name)
            return
        self._owned[name] = index
        self._pending.discard(name)
        log.info("discovery %s: worker %s at %s serves %s", spec.label, name, url, ", ".join(models))

    async def _leave(self, name: str, index: int) -> None:
        spec = self.specs[index]
        try:
            self.pool.router.drain(name, True)
        except KeyError:  # removed meanwhile (the worker deregistered itself)
            self._owned.pop(name, None)
            self._leaving.pop(name, None)
            return
        log.info("discovery %s: worker %s left; draining for up to %.0f s", spec.label, name, spec.drain_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.drain_s
        # The router signals no in-flight changes; a poll bounded by drain_s is all there is.
        while self._in_flight(name) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.25)
        # From here on an arrival cannot cancel us: it waits (pending) and the wake re-adds it.
        self._leaving.pop(name, None)
        self._removing.add(name)
        try:
            await self.pool.remove(name)
            log.info("discovery %s: worker %s removed", spec.label, name)
        finally:
            self._removing.discard(name)
            self._owned.pop(name, None)
            self._wake.set()

    def _in_flight(self, name: str) -> int:
        return sum(w.in_flight for w in self.pool.router.workers() if w.name == name)

    def _undrain(self, name: str) -> None:
        try:
            self.pool.router.drain(name, False)
        except KeyError:
            pass
