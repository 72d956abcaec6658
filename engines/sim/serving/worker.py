"""One simulated worker's lifecycle: engine, driver, KV-event publisher, metrics and its HTTP server.

Many `SimWorker`s share one event loop (a live fleet: `--replicas N`). Each binds
its own HTTP port and KV-event ports, so to the gateway each is a separate vLLM-
shaped worker. `start` returns once the HTTP port listens; `stop` is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from engines.launchers.registration import WorkerRecord
from engines.launchers.vllm import kv_bind_endpoints
from engines.launchers.worker_guard import WorkerKeyGuard
from engines.sim.model.config import SimConfig
from engines.sim.model.engine import SimEngine
from engines.sim.model.profile import Profile
from engines.sim.serving.driver import EngineDriver
from engines.sim.serving.metrics import SimMetrics
from engines.sim.serving.openai_requests import RequestParser
from engines.sim.serving.publisher import KVEventPublisher
from engines.sim.serving.server import build_app
from engines.text.tokenizer import ChatTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    name: str  # stable: the gateway's X-Sluice-Worker and metric label
    model_name: str  # the id it serves
    model_root: str  # the model directory (its tokenizer); `root` in /v1/models
    host: str
    port: int
    public_host: str  # what others use to reach it
    kv_events_port: int | None  # PUB port; replay on the next one; None: no KV events
    topic: str = "kv"
    worker_key: str | None = field(default=None, repr=False)  # every route but /health, /metrics needs it

    @property
    def url(self) -> str:
        return f"http://{self.public_host}:{self.port}"

    def kv_endpoints(self) -> tuple[str | None, str | None]:
        """The (events, replay) endpoints a subscriber connects to."""
        if self.kv_events_port is None:
            return None, None
        p = self.kv_events_port
        return f"tcp://{self.public_host}:{p}", f"tcp://{self.public_host}:{p + 1}"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # one process runs many servers: the fleet handles SIGTERM/SIGINT for all of them


class SimWorker:
    def __init__(self, settings: WorkerSettings, config: SimConfig, profile: Profile, tokenizer: ChatTokenizer) -> None:
        self.settings = settings
        self.config = config
        self.profile = profile
        self.tokenizer = tokenizer
        self.engine = SimEngine(config)
        self.metrics = SimMetrics(self.engine, settings.model_name, profile)
        self.publisher: KVEventPublisher | None = None
        self.driver = EngineDriver(self.engine, self.metrics)
        self.parser = RequestParser(settings.model_name, tokenizer, config.max_model_len, config.vocab_size)
        self.created = int(time.time())
        self._tasks: list[asyncio.Task[Any]] = []
        self._server: _Server | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def model_card(self) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": self.settings.model_name, "object": "model", "created": self.created,
            "owned_by": "sluice-sim", "root": self.settings.model_root, "parent": None,
            "max_model_len": self.config.max_model_len, "max_num_seqs": self.config.max_num_seqs,
            "sim_profile": self.profile.name}]}

    def record(self) -> WorkerRecord:
        """What `--gateway` registers: engine "sim", which the gateway talks to as it talks to vLLM."""
        events, replay = self.settings.kv_endpoints()
        return WorkerRecord(name=self.settings.name, url=self.settings.url, models=(self.settings.model_name,),
                            engine="sim", block_size=self.config.block_size, kv_events_endpoint=events,
                            kv_events_replay_endpoint=replay, tokenizer=self.settings.model_root,
                            capacity=self.config.max_num_seqs)

    async def start(self) -> None:
        s = self.settings
        sock = _listen(s.host, s.port)  # bound here, so a busy port is an OSError, not uvicorn's sys.exit
        try:
            if s.kv_events_port is not None:
                p = s.kv_events_port
                self.publisher = KVEventPublisher(*kv_bind_endpoints(s.host, p), topic=s.topic)
                self.driver.publisher = self.publisher
                self._tasks.append(asyncio.create_task(self.publisher.serve_replay(), name=f"{s.name}-replay"))
            self._tasks.append(asyncio.create_task(self.driver.run(), name=f"{s.name}-engine"))
            app = WorkerKeyGuard(build_app(self), s.worker_key) if s.worker_key else build_app(self)
            config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
            self._server = _Server(config)
            self._serving = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"{s.name}-http")
            while not self._server.started:
                if self._serving.done():
                    raise RuntimeError(f"sim worker {s.name}: HTTP server on {s.host}:{s.port} stopped at start")
                await asyncio.sleep(0.01)
        except BaseException:
            sock.close()
            await self.stop()
            raise
        log.info("sim worker %s serving %s at %s (profile %s, KV events %s)", s.name, s.model_name, s.url,
                 self.profile.name, s.kv_endpoints()[0] or "off")

    async def stop(self) -> None:
        """Stop serving (uvicorn closes the socket), then the engine loop and the publisher."""
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await asyncio.gather(self._serving, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.publisher is not None:
            self.publisher.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say
    # they are TCP, and with Nagle on, a keep-alive client waited 40 ms for every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"sim worker cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
