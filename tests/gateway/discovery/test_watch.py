"""The EndpointSlice list + watch loop (gateway/discovery/watch.py), driving the official `kubernetes`
client against tests/standins/k8s_api_standin.py: a STAND-IN for the API server, since none can run here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.discovery import watch as watch_module
from gateway.discovery.spec import parse_discovery
from gateway.discovery.watch import SliceWatcher
from tests.standins.k8s_api_standin import K8sApiStandin, endpoint_slice

pytestmark = pytest.mark.integration
LABELS = {"app.kubernetes.io/component": "vllm-worker"}
SELECTOR = "app.kubernetes.io/component=vllm-worker"


@pytest.fixture
def api() -> Iterator[K8sApiStandin]:
    server = K8sApiStandin(bookmark_interval_s=0.3).start()
    yield server
    server.stop()


def _slice(name: str, *pods: tuple[str, str, bool]) -> dict:
    return endpoint_slice(name, f"svc-{name}", list(pods), port=8100, labels=LABELS)


def _until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def watcher(api: K8sApiStandin, tmp_path: Path) -> Iterator[tuple[SliceWatcher, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    spec = parse_discovery(f"namespace=sluice,selector={SELECTOR},kubeconfig={kubeconfig}")
    w = SliceWatcher(spec, seen.append, watch_timeout_s=3, backoff_min_s=0.1, backoff_max_s=0.4)
    yield w, seen
    w.stop()


def test_lists_then_follows_changes(api: K8sApiStandin, watcher: tuple[SliceWatcher, list]) -> None:
    w, seen = watcher
    api.put(_slice("a", ("pod-a", "10.0.0.1", True), ("pod-b", "10.0.0.2", False)))
    api.put(endpoint_slice("other", "other", [("x", "10.0.0.9", True)], port=8100))  # not selected
    w.start()
    _until(lambda: seen == [{"pod-a": "http://10.0.0.1:8100"}])
    api.put(_slice("a", ("pod-a", "10.0.0.1", True), ("pod-b", "10.0.0.2", True)))
    _until(lambda: seen[-1] == {"pod-a": "http://10.0.0.1:8100", "pod-b": "http://10.0.0.2:8100"})
    api.delete("a")
    _until(lambda: seen[-1] == {})
    watches = [r for r in api.requests if r.get("watch")]
    assert watches[0]["resourceVersion"] == "102"  # from the list's version, not from scratch
    assert all(r["labelSelector"] == SELECTOR and r["allowWatchBookmarks"] == "true" for r in watches)
    assert w.lists == 1 and w.failures == 0


def test_bookmarks_and_timeouts_resume_from_the_newest_version(api: K8sApiStandin,
                                                              watcher: tuple[SliceWatcher, list]) -> None:
    w, _ = watcher
    api.put(_slice("a", ("pod-a", "10.0.0.1", True)))
    w.start()
    _until(lambda: w.lists == 1)
    api.put(endpoint_slice("other", "other", [], port=1))  # moves the version; only a bookmark says so
    _until(lambda: w.cache.resource_version == "102", 30)
    _until(lambda: len([r for r in api.requests if r.get("watch")]) >= 2, 30)  # the 3 s watch ended; resumed
    assert [r for r in api.requests if r.get("watch")][1]["resourceVersion"] == "102"
    assert w.lists == 1


def test_410_gone_lists_again(api: K8sApiStandin, watcher: tuple[SliceWatcher, list]) -> None:
    w, seen = watcher
    api.put(_slice("a", ("pod-a", "10.0.0.1", True)))
    w.start()
    _until(lambda: w.lists == 1)
    api.drop_watches()  # the watch breaks while the pod leaves, and the history is compacted
    api.put(_slice("a", ("pod-b", "10.0.0.2", True)))
    api.compact()
    _until(lambda: w.lists == 2)
    _until(lambda: seen[-1] == {"pod-b": "http://10.0.0.2:8100"})


def test_errors_back_off_and_keep_what_is_known(api: K8sApiStandin, watcher: tuple[SliceWatcher, list]) -> None:
    w, seen = watcher
    api.put(_slice("a", ("pod-a", "10.0.0.1", True)))
    w.start()
    _until(lambda: w.lists == 1)
    api.fail_next(3, status=503)
    api.drop_watches()
    _until(lambda: w.failures >= 4)  # the dropped watch, then three 503s
    assert seen[-1] == {"pod-a": "http://10.0.0.1:8100"}  # an API outage removes no worker
    api.put(_slice("a", ("pod-a", "10.0.0.1", True), ("pod-c", "10.0.0.3", True)))
    _until(lambda: "pod-c" in seen[-1])
    assert w.lists == 1  # it resumed watching from its version; no list was needed


def test_lists_are_paged(api: K8sApiStandin, watcher: tuple[SliceWatcher, list],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_module, "_PAGE", 2)
    w, seen = watcher
    for i in range(5):
        api.put(_slice(f"s{i}", (f"pod-{i}", f"10.0.0.{i + 1}", True)))
    w.start()
    _until(lambda: bool(seen) and len(seen[-1]) == 5)
    pages = [r for r in api.requests if not r.get("watch")]
    assert len(pages) == 3 and all(r["limit"] == "2" for r in pages) and "continue" in pages[1]


def test_a_wrong_token_is_a_failure_not_an_empty_list(api: K8sApiStandin, tmp_path: Path) -> None:
    api.store.token = "another-token"  # the kubeconfig written below holds this one; the server wants none of it
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.store.token = "the-real-token"
    seen: list[dict[str, str]] = []
    w = SliceWatcher(parse_discovery(f"namespace=sluice,selector=a=b,kubeconfig={kubeconfig}"), seen.append,
                     backoff_min_s=0.05, backoff_max_s=0.1)
    w.start()
    try:
        _until(lambda: w.failures >= 2)
        assert seen == [] and w.lists == 0
    finally:
        w.stop()


def test_stop_is_prompt_during_a_watch(api: K8sApiStandin, watcher: tuple[SliceWatcher, list]) -> None:
    w, _ = watcher
    w.watch_timeout_s = 600
    w.start()
    _until(lambda: any(r.get("watch") for r in api.requests))
    w.stop()
    _until(lambda: not w.alive, 60)  # a stop that waited for the watch to end would take 600 s
