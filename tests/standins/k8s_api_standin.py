"""STAND-IN for a Kubernetes API server's EndpointSlice endpoints (no API server can run here).

This is NOT Kubernetes. It serves the one resource Sluice's discovery reads,
`discovery.k8s.io/v1` EndpointSlices of one namespace, in the API's wire format, so
the official `kubernetes` client can be pointed at it unchanged (through a kubeconfig):

- `GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices`: a list
  (`EndpointSliceList`, `metadata.resourceVersion`; `limit` + `continue` paging;
  items without kind/apiVersion, as the API server sends them), with `labelSelector`
  (equality: `k=v`, `k==v`, `k!=v`, `k`, `!k`; sets: `k in (a,b)`, `k notin (a,b)`);
- the same path with `watch=1`: newline-delimited JSON events `{"type": ADDED |
  MODIFIED | DELETED | BOOKMARK | ERROR, "object": ...}` after `resourceVersion`,
  bookmarks when `allowWatchBookmarks` is set, closed after `timeoutSeconds`; no
  `resourceVersion` (or "0") starts with a synthetic ADDED per object;
- a `resourceVersion` older than the compacted history: HTTP 200 then one ERROR
  event carrying a `Status` with code 410 "Expired", as the API server answers;
- errors as `Status` objects; a bearer token is required when one is set.

Test controls (stand-in only, called from the test process): `put` / `delete`
slices, `compact()` the history, `fail_next(n, status)`, `drop_watches()`, and the
`requests` log.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

_PATH = re.compile(r"^/apis/discovery\.k8s\.io/v1/namespaces/([^/]+)/endpointslices$")
_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics, for the forms listed in the module docstring."""
    for term in _split_terms(selector):
        if not term:
            continue
        m = _SET_TERM.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (key in labels and labels[key] in values):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += ch
    return [*terms, current.strip()]


@dataclass
class _Store:
    namespace: str
    token: str | None
    bookmark_interval_s: float
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # (rv, type, object)
    version: int = 100
    compacted: int = 0  # watches from a version below this get 410
    failures: list[int] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)
    generation: int = 0  # bumped by drop_watches()
    cond: threading.Condition = field(default_factory=threading.Condition)


class K8sApiStandin:
    """The stand-in server on 127.0.0.1:<port>, serving from a thread."""

    def __init__(self, namespace: str = "sluice", token: str | None = "standin-token",
                 bookmark_interval_s: float = 1.0) -> None:
        self.store = _Store(namespace, token, bookmark_interval_s)
        store = self.store

        class Handler(_Handler):
            pass

        Handler.store = store
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="k8s-api-standin", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> K8sApiStandin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose only cluster is this stand-in (and whose user holds its token)."""
        user: dict[str, Any] = {"token": self.store.token} if self.store.token else {}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": user}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin",
                                                         "namespace": self.store.namespace}}]}))
        return path

    # -- test controls -------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> int:
        """Create or replace a slice (ADDED or MODIFIED); returns its new resourceVersion."""
        s = self.store
        with s.cond:
            obj = copy.deepcopy(obj)
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in s.slices else "ADDED"
            return self._record(kind, name, obj)

    def delete(self, name: str) -> int:
        s = self.store
        with s.cond:
            obj = copy.deepcopy(s.slices[name])
            return self._record("DELETED", name, obj)

    def compact(self) -> None:
        """Forget the history: a watch from any resourceVersion older than the newest gets 410."""
        with self.store.cond:
            self.store.compacted = self.store.version
            self.store.history.clear()

    def fail_next(self, count: int, status: int = 500) -> None:
        with self.store.cond:
            self.store.failures += [status] * count

    def drop_watches(self) -> None:
        with self.store.cond:
            self.store.generation += 1
            self.store.cond.notify_all()

    @property
    def requests(self) -> list[dict[str, str]]:
        return list(self.store.requests)

    def _record(self, kind: str, name: str, obj: dict[str, Any]) -> int:
        s = self.store
        s.version += 1
        meta = obj.setdefault("metadata", {})
        meta.update(resourceVersion=str(s.version), namespace=s.namespace)
        meta.setdefault("uid", f"standin-{name}")
        obj.update(apiVersion="discovery.k8s.io/v1", kind="EndpointSlice")
        if kind == "DELETED":
            s.slices.pop(name, None)
        else:
            s.slices[name] = obj
        s.history.append((s.version, kind, obj))
        s.cond.notify_all()
        return s.version


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: _Store

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        s = self.store
        with s.cond:
            s.requests.append({"path": url.path, **query})
            failure = s.failures.pop(0) if s.failures else None
        if s.token and self.headers.get("Authorization") != f"Bearer {s.token}":
            return self._json(401, _status(401, "Unauthorized", "Unauthorized"))
        if failure is not None:
            return self._json(failure, _status(failure, "InternalError", "stand-in fault injected"))
        m = _PATH.match(url.path)
        if not m or m.group(1) != s.namespace:
            return self._json(404, _status(404, "NotFound", f"the server could not find {url.path}"))
        if query.get("watch") in ("1", "true"):
            return self._watch(query)
        return self._list(query)

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _list(self, query: dict[str, str]) -> None:
        s = self.store
        selector = query.get("labelSelector", "")
        with s.cond:
            if "continue" in query:
                token = json.loads(base64.urlsafe_b64decode(query["continue"]))
                version, offset = token["rv"], token["offset"]
            else:
                version, offset = s.version, 0
            items = [_list_item(o) for _, o in sorted(s.slices.items())
                     if selector_matches(selector, o["metadata"].get("labels") or {})]
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[offset:offset + limit]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if offset + limit < len(items):
            cont = json.dumps({"rv": version, "offset": offset + limit}).encode()
            meta["continue"] = base64.urlsafe_b64encode(cont).decode()
        self._json(200, {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1", "metadata": meta,
                         "items": page})

    def _watch(self, query: dict[str, str]) -> None:
        s = self.store
        selector = query.get("labelSelector", "")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with s.cond:
            since = query.get("resourceVersion") or "0"
            generation = s.generation
            if since == "0":
                pending = [("ADDED", o) for _, o in sorted(s.slices.items())]
                cursor = s.version
            elif int(since) < s.compacted:
                message = f"too old resource version: {since} ({s.compacted})"
                self._send([{"type": "ERROR", "object": _status(410, "Expired", message)}])
                return self._end()
            else:
                pending = [(t, o) for rv, t, o in s.history if rv > int(since)]
                cursor = s.version
        try:
            self._stream(pending, cursor, selector, deadline, bookmarks, generation)
        except (BrokenPipeError, ConnectionResetError):
            return

    def _stream(self, pending: list[tuple[str, dict[str, Any]]], cursor: int, selector: str, deadline: float,
                bookmarks: bool, generation: int) -> None:
        s = self.store
        next_bookmark = time.monotonic() + s.bookmark_interval_s
        while True:
            self._send([{"type": t, "object": o} for t, o in pending
                        if selector_matches(selector, o["metadata"].get("labels") or {})])
            now = time.monotonic()
            if now >= deadline:
                return self._end()
            if bookmarks and now >= next_bookmark:
                with s.cond:
                    version = s.version
                self._send([{"type": "BOOKMARK", "object": {"kind": "EndpointSlice", "apiVersion":
                             "discovery.k8s.io/v1", "metadata": {"resourceVersion": str(version)}}}])
                next_bookmark = now + s.bookmark_interval_s
            with s.cond:
                s.cond.wait(timeout=min(0.2, max(0.0, deadline - now)))
                if s.generation != generation:  # dropped: cut the connection mid-stream
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                pending = [(t, o) for rv, t, o in s.history if rv > cursor]
                cursor = max([cursor, *(rv for rv, _, _ in s.history)])

    def _send(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            line = (json.dumps(event) + "\n").encode()
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        if events:
            self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _list_item(obj: dict[str, Any]) -> dict[str, Any]:
    item = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return copy.deepcopy(item)


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, str, bool]], *, port: int,
                   port_name: str = "http", labels: dict[str, str] | None = None,
                   terminating: tuple[str, ...] = ()) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes one: `endpoints` are (pod, ip, ready)."""
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service,
                                              "endpointslice.kubernetes.io/managed-by":
                                                  "endpointslice-controller.k8s.io", **(labels or {})},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                          "uid": f"uid-{service}", "controller": True,
                                          "blockOwnerDeletion": True}]},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip],
                       "conditions": {"ready": ready and pod not in terminating, "serving": ready,
                                      "terminating": pod in terminating},
                       "targetRef": {"kind": "Pod", "namespace": "sluice", "name": pod, "uid": f"uid-{pod}"},
                       "nodeName": "node-a"} for pod, ip, ready in endpoints],
        "ports": [{"name": port_name, "protocol": "TCP", "port": port}],
    }
