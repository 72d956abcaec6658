"""Registration calls leave from the worker's own address when it binds one: a registration key may
register only a worker whose URL host is the caller's address, and with several addresses on a node
(or loopback "pods", tests/integration/test_multinode_ray_smoke.py) the route would pick another."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engines.launchers import registration


class _Peer(BaseHTTPRequestHandler):
    peers: list[str] = []  # noqa: RUF012

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        _Peer.peers.append(self.client_address[0])
        body = json.dumps({}).encode()
        self.send_response(201)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Peer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Peer.peers.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_registration_leaves_from_the_workers_address(gateway: str) -> None:
    record = registration.WorkerRecord(name="w", url="http://127.0.0.7:8100")
    registration.register(gateway, record, None, attempts=1, source="127.0.0.7")
    registration.register(gateway, record, None, attempts=1)
    assert _Peer.peers == ["127.0.0.7", "127.0.0.1"]  # without a source, the route's own choice


@pytest.mark.parametrize(("host", "public", "source"), [
    ("10.1.2.3", "10.1.2.3", "10.1.2.3"),
    ("0.0.0.0", "10.1.2.3", None),  # a wildcard is no address to leave from
    ("::", "::", None),
    ("10.1.2.3", "gw-proxy.example", None),  # registered under another address: the route decides
    ("node0.example", "node0.example", None),  # a name: not resolved here
])
def test_registration_source(host: str, public: str, source: str | None) -> None:
    assert registration.registration_source(host, public) == source
