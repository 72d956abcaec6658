"""A gateway that finds its workers in Kubernetes EndpointSlices (`--k8s-discovery`).

The workers are the two real vLLM workers of conftest.py. The Kubernetes API is
tests/standins/k8s_api_standin.py, a STAND-IN (no API server can run here), which the
gateway's official `kubernetes` client reaches through a kubeconfig. Each worker gets
its own slice (as a per-pod Service would), because both listen on 127.0.0.1 with
different ports and one slice carries one port for all its endpoints. Each worker
also registers under its pod's name and URL with the registration key, as `sluice
worker --gateway` does in a pod: a labelled slice alone admits nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.launchers.registration import WorkerRecord, register
from gateway.discovery import K8sDiscovery, parse_discovery
from gateway.http.app import build_state
from gateway.settings import Settings
from tests.integration.conftest import MODEL, WORKER_KEY, Worker
from tests.integration.security_support import new_key
from tests.integration.vllm_support import engines_stopped
from tests.servers import Server, llm_only_repository, start_server, wait_healthy
from tests.standins.k8s_api_standin import K8sApiStandin, endpoint_slice

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
LABELS = {"app.kubernetes.io/component": "vllm-worker"}
PODS = ("vllm-pod-a", "vllm-pod-b")
REGISTRATION = new_key("registration")


def _slice(worker: Worker, pod: str, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    port = int(worker.url.rsplit(":", 1)[1])
    return endpoint_slice(f"sluice-{pod}-x7k2p", f"sluice-{pod}", [(pod, "127.0.0.1", ready)], port=port,
                          labels=LABELS, terminating=(pod,) if terminating else ())


@pytest.fixture(scope="module")
def cluster(workers: list[Worker], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[K8sApiStandin,
                                                                                              Server]]:
    tmp = tmp_path_factory.mktemp("k8s")
    api = K8sApiStandin(bookmark_interval_s=1.0).start()
    for worker, pod in zip(workers, PODS, strict=True):
        api.put(_slice(worker, pod))
    spec = (f"namespace=sluice,selector=app.kubernetes.io/component=vllm-worker,port=http,engine=vllm,"
            f"kubeconfig={api.write_kubeconfig(tmp / 'kubeconfig')},drain_s=30")
    gateway = start_server(["--model-repository", str(llm_only_repository(tmp)), "--k8s-discovery", spec],
                           tmp / "gateway.log", env={"SLUICE_WORKER_KEY": WORKER_KEY,
                                                     "SLUICE_REGISTRATION_KEY": REGISTRATION}, wait=False)
    for worker, pod in zip(workers, PODS, strict=True):
        register(gateway.url, WorkerRecord(name=pod, url=worker.url, engine="vllm"), REGISTRATION)
    wait_healthy(gateway, 240)
    yield api, gateway
    gateway.stop()
    api.stop()


def _workers(gateway: Server) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{gateway.url}/v1/admin/workers", headers={"Authorization": f"Bearer {REGISTRATION}"})
    return {w["name"]: w for w in r.json()["data"]}


def _until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def _served_by(gateway: Server, n: int, prompt: str) -> list[str]:
    out = []
    for i in range(n):
        r = httpx.post(f"{gateway.url}/v1/completions", timeout=120, headers={"X-Routing-Policy": "round_robin"},
                       json={"model": MODEL, "prompt": f"{prompt} {i}", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        out.append(r.headers["x-sluice-worker"])
    return out


def test_discovered_workers_serve_and_keep_their_kv_events(cluster: tuple[K8sApiStandin, Server],
                                                           workers: list[Worker]) -> None:
    api, gateway = cluster
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    found = _workers(gateway)
    assert {name: w["url"] for name, w in found.items()} == {pod: w.url for pod, w in zip(PODS, workers,
                                                                                          strict=True)}
    assert all(w["kv_events"] for w in found.values())  # read from each vLLM's /kv_event_sources
    assert [m["id"] for m in httpx.get(f"{gateway.url}/v1/models").json()["data"]] == [MODEL]
    assert set(_served_by(gateway, 4, "Discovered workers")) == set(PODS)
    assert {r["path"] for r in api.requests} == {"/apis/discovery.k8s.io/v1/namespaces/sluice/endpointslices"}


def test_a_worker_that_leaves_is_drained_then_removed_and_may_come_back(
        cluster: tuple[K8sApiStandin, Server], workers: list[Worker]) -> None:
    api, gateway = cluster
    pod_b, worker_b = PODS[1], workers[1]
    body = {"model": MODEL, "prompt": "A long answer", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True}
    session = _session_for(gateway, pod_b)
    # Worker b's engine is stopped (SIGSTOP) before the request is sent, so the request is certainly
    # in flight on b while its pod is marked terminating: tiny-llama writes 1500 tokens in a few
    # seconds, and a stream started first could finish before the test looked.
    out: dict[str, Any] = {}
    reader = threading.Thread(target=_read_stream, args=(gateway, body, session, out), daemon=True)
    with engines_stopped([worker_b.proc.pid]):
        reader.start()
        _until(lambda: _workers(gateway)[pod_b]["in_flight"] == 1, 10)  # dispatched to b
        api.put(_slice(worker_b, pod_b, ready=False, terminating=True))  # the pod is terminating
        _until(lambda: _workers(gateway)[pod_b]["draining"], 10)
        assert set(_served_by(gateway, 3, "While b drains")) == {PODS[0]}
        assert _workers(gateway)[pod_b]["in_flight"] == 1  # kept while its request runs
    reader.join(120)
    assert out.get("worker") == pod_b, out
    rest = out["lines"]  # the request in flight finished on the draining worker
    assert rest[-1] == "data: [DONE]" and '"finish_reason":"length"' in "".join(rest).replace(" ", "")
    _until(lambda: pod_b not in _workers(gateway), 10)  # its in-flight request done: removed
    assert set(_served_by(gateway, 3, "After b left")) == {PODS[0]}
    api.put(_slice(worker_b, pod_b))
    _until(lambda: pod_b in _workers(gateway) and not _workers(gateway)[pod_b]["draining"])
    assert set(_served_by(gateway, 4, "b is back")) == set(PODS)


def _read_stream(gateway: Server, body: dict[str, Any], session: str, out: dict[str, Any]) -> None:
    headers = {"X-Routing-Policy": "session", "X-Session-Id": session}
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", f"{gateway.url}/v1/completions", json=body, headers=headers) as stream:
        out["worker"] = stream.headers.get("x-sluice-worker")
        out["lines"] = [line for line in stream.iter_lines() if line]


def _session_for(gateway: Server, pod: str) -> str:
    """A session id the `session` policy maps to `pod`."""
    for i in range(64):
        r = httpx.post(f"{gateway.url}/v1/completions", timeout=120,
                       headers={"X-Routing-Policy": "session", "X-Session-Id": f"s-{i}"},
                       json={"model": MODEL, "prompt": "Which worker", "max_tokens": 1})
        if r.headers.get("x-sluice-worker") == pod:
            return f"s-{i}"
    raise AssertionError(f"no session maps to {pod}")


def test_a_labelled_service_without_the_registration_key_is_refused(cluster: tuple[K8sApiStandin, Server],
                                                                    workers: list[Worker]) -> None:
    """Anyone who may label a Service cannot point the gateway at a pod: its endpoint never
    registered with the registration key, so it is never routed to, whatever it answers."""
    api, gateway = cluster
    port = int(workers[1].url.rsplit(":", 1)[1])
    rogue = endpoint_slice("sluice-rogue-x1", "sluice-rogue", [("rogue-pod", "127.0.0.1", True)], port=port,
                           labels=LABELS)
    api.put(rogue)
    try:
        _until(lambda: "endpoint rogue-pod at http://127.0.0.1:" in gateway.log()
               and "is not admitted" in gateway.log())
        assert "rogue-pod" not in _workers(gateway)
        assert set(_served_by(gateway, 4, "Only registered workers")) == set(PODS)
        # Registering it takes a key with the `workers` scope; without one it stays out.
        r = httpx.post(f"{gateway.url}/v1/admin/workers", json={"name": "rogue-pod", "url": workers[1].url})
        assert r.status_code == 401
        assert "rogue-pod" not in _workers(gateway)
    finally:
        api.delete(rogue["metadata"]["name"])


def test_api_outages_keep_workers_and_410_relists(cluster: tuple[K8sApiStandin, Server],
                                                  workers: list[Worker]) -> None:
    api, gateway = cluster
    lists = sum(1 for r in api.requests if not r.get("watch"))
    api.fail_next(4, status=500)
    api.drop_watches()
    _until(lambda: not api.store.failures)  # the watcher went through every injected failure
    assert set(_workers(gateway)) == set(PODS)  # an API outage removes nobody
    assert set(_served_by(gateway, 2, "During the outage")) == set(PODS)
    api.drop_watches()
    api.put(_slice(workers[0], PODS[0], ready=False))  # missed while the watch was down...
    api.compact()  # ...and the history is gone: 410, then a fresh list
    _until(lambda: set(_workers(gateway)) == {PODS[1]})
    assert sum(1 for r in api.requests if not r.get("watch")) > lists
    api.put(_slice(workers[0], PODS[0]))
    _until(lambda: set(_workers(gateway)) == set(PODS))


def test_without_endpoints_the_model_has_no_worker(cluster: tuple[K8sApiStandin, Server]) -> None:
    api, gateway = cluster
    saved = [api.store.slices[name] for name in sorted(api.store.slices)]
    for obj in saved:
        api.delete(obj["metadata"]["name"])
    try:
        _until(lambda: not _workers(gateway))
        r = httpx.post(f"{gateway.url}/v1/completions", timeout=30, json={"model": MODEL, "prompt": "x"})
        assert r.status_code in (404, 503), r.text
    finally:
        for obj in saved:
            api.put({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
    _until(lambda: set(_workers(gateway)) == set(PODS))


async def test_the_discovery_loop_and_its_watchers_are_supervised(workers: list[Worker], tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """In process: a reconcile pass that raises is logged and the loop restarts and finishes the
    work; a watcher thread that dies is replaced and the new one keeps following the slices."""
    caplog.set_level(logging.INFO, "sluice.discovery")
    api = K8sApiStandin().start()
    api.put(_slice(workers[0], PODS[0]))
    spec = f"selector=app.kubernetes.io/component=vllm-worker,namespace=sluice," \
           f"kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}"
    state = build_state(Settings(model_repository=None, grpc_port=0, k8s_discovery=(spec,), worker_key=WORKER_KEY))
    for worker, pod in zip(workers, PODS, strict=True):  # as their registrations would
        await state.attestations.vouch(pod, worker.url)
    discovery = K8sDiscovery([parse_discovery(spec)], state.workers, state.attestations, retry_s=0.2)
    reconcile, calls = discovery.reconcile, []

    async def dies_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in one pass")
        await reconcile()

    discovery.reconcile = dies_once  # type: ignore[method-assign]
    try:
        await discovery.start()
        await asyncio.wait_for(discovery.synced.wait(), 60)
        assert discovery.restarts == 1 and "background task k8s-discovery failed" in caplog.text
        assert set(state.workers.records) == {PODS[0]}
        first = discovery.watchers[0]
        first.stop()  # its thread ends, as if it had died
        for _ in range(100):
            if discovery.watchers[0] is not first:
                break
            await asyncio.sleep(0.1)
        assert discovery.watchers[0] is not first and "the watcher thread died" in caplog.text
        api.put(_slice(workers[1], PODS[1]))
        for _ in range(200):
            if PODS[1] in state.workers.records:
                break
            await asyncio.sleep(0.1)
        assert set(state.workers.records) == set(PODS)
    finally:
        await discovery.stop()
        await state.workers.stop()
        api.stop()
