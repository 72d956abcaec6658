"""List + watch EndpointSlices with the official `kubernetes` client, on a daemon thread.

The client is synchronous (urllib3), so the loop runs on its own thread and hands
every change to the event loop through `on_change(ready_workers)`. The protocol is
the API's own (the reflector pattern of client-go):

1. list (paged), remember the list's `metadata.resourceVersion`;
2. watch from that version with bookmarks, for at most `watch_timeout_s` per request,
   and resume from the last version seen (bookmarks move it too);
3. 410 Gone (an ERROR event, or the status of the request): the version is too old,
   list again;
4. any other failure: wait a bounded, doubling backoff, then watch again from the last
   version (list again if there never was one). What is known is kept meanwhile:
   losing the API server does not remove workers.

A daemon thread, not `asyncio.to_thread`: a watch blocks for minutes, and the
default executor is joined at interpreter shutdown.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from gateway.discovery.slices import SliceCache, ready_workers
from gateway.discovery.spec import DiscoverySpec

log = logging.getLogger("sluice.discovery")

OnChange = Callable[[dict[str, str]], None]
_PAGE = 500


class SliceWatcher:
    """One spec's list + watch loop. `start()` once; `stop()` is idempotent and prompt."""

    def __init__(self, spec: DiscoverySpec, on_change: OnChange, *, watch_timeout_s: int = 240,
                 backoff_min_s: float = 0.5, backoff_max_s: float = 30.0) -> None:
        self.spec = spec
        self.on_change = on_change
        self.watch_timeout_s = watch_timeout_s
        self.backoff_min_s, self.backoff_max_s = backoff_min_s, backoff_max_s
        self.cache = SliceCache()
        self.lists = 0  # full lists done: the first, and one after each 410
        self.failures = 0  # failed requests, each followed by a backoff
        self._stop = threading.Event()
        self._progress = False  # a list or a watch event since the last failure
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name=f"k8s-discovery {spec.label}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.stop()  # shuts the socket down, so a blocked read returns

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        delay = self.backoff_min_s
        need_list, expired = True, False
        api = None
        while not self._stop.is_set():
            try:
                api = api or self._api()
                if need_list:
                    self._list(api)
                    need_list = False
                self._watch_once(api)
                delay, expired = self.backoff_min_s, False
                continue
            except Exception as exc:
                if self._stop.is_set():
                    break
                if self._progress:  # the last attempt got somewhere: start the backoff over
                    delay, self._progress = self.backoff_min_s, False
                if _status(exc) == 410:
                    log.info("discovery %s: resourceVersion %s expired; listing again", self.spec.label,
                             self.cache.resource_version)
                    need_list = True
                    if not expired:  # list again at once; a server that keeps answering 410 gets the backoff
                        expired = True
                        continue
                else:  # connection refused, timeouts, 5xx, a body we cannot parse
                    log.warning("discovery %s: %s; retrying in %.1f s", self.spec.label, _describe(exc), delay)
            self.failures += 1
            need_list = need_list or self.cache.resource_version is None
            self._stop.wait(delay)
            delay = min(delay * 2, self.backoff_max_s)

    def _api(self) -> Any:
        from kubernetes import client
        from kubernetes import config as untyped_config

        config: Any = untyped_config  # the loaders carry no annotations
        cfg = client.Configuration()
        if self.spec.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=self.spec.kubeconfig, context=self.spec.context,
                                    client_configuration=cfg)
        return client.DiscoveryV1Api(client.ApiClient(cfg))

    def _list(self, api: Any) -> None:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = api.list_namespaced_endpoint_slice(self.spec.namespace, label_selector=self.spec.selector,
                                                      limit=_PAGE, _continue=token, _request_timeout=(10, 60))
            body = api.api_client.sanitize_for_serialization(page)
            items += body.get("items") or []
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self.lists += 1
        self._progress = True
        self.cache.replace(items, meta.get("resourceVersion"))
        log.info("discovery %s: listed %d slice(s) at resourceVersion %s", self.spec.label, len(items),
                 self.cache.resource_version)
        self._publish()

    def _watch_once(self, api: Any) -> None:
        from kubernetes import watch as untyped_watch

        watch: Any = untyped_watch  # Watch carries no annotations
        self._watch = w = watch.Watch()
        try:
            stream = w.stream(api.list_namespaced_endpoint_slice, self.spec.namespace,
                              label_selector=self.spec.selector, resource_version=self.cache.resource_version,
                              allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                              _request_timeout=(10, self.watch_timeout_s + 30))
            for event in stream:
                if self._stop.is_set():
                    break
                self._progress = True
                if self.cache.apply(event["type"], event["raw_object"]):
                    self._publish()
        finally:
            self._watch = None
            w.stop()

    def _publish(self) -> None:
        self.on_change(ready_workers(self.cache.slices.values(), self.spec.port))


def _status(exc: Exception) -> int | None:
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


def _describe(exc: Exception) -> str:
    status = _status(exc)
    return f"API answered {status} {getattr(exc, 'reason', '')}".strip() if status else str(exc) or repr(exc)
