"""A fleet of simulated vLLM engines behind the real router, in virtual time.

One `engines.sim.SimEngine` per worker (the calibrated profile's cost model and
engine shape), one `router.Router` whose clock is the simulation's, and a
discrete-event loop over a heap of ``(time, seq, kind, payload)`` (Vidur's
shape). No sockets, no sleeping: a run's figures depend on its inputs and seeds
only, never on the machine's load.

What the router sees is what it sees in the gateway, through the same calls:

- an arrival is ranked (``router.rank``, or an experiment's own chooser), then
  ``on_dispatch`` to the first candidate; the engine gets it `request_delay_s`
  later;
- a step's outputs reach the gateway `response_delay_s` after the step ends:
  the first one is ``on_first_token``, the last one ``on_finish`` with the
  engine's cached tokens;
- a step's KV events reach ``router.feed.apply_kv_batch`` `kv_event_delay_s`
  after it ends (decoded as the ZMQ subscriber decodes them, see `kv`);
- every `scrape_interval_s` each worker's /metrics (running, waiting, KV usage,
  cache config) reach
  ``router.feed.apply_scrape``; every `maintain_interval_s`, ``maintain()``.

Sessions (`sessions`) give the turns; a closed-loop session's next turn is
asked for once the previous one finished. `run()` returns a `RunResult`.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import xxhash

from engines.sim import RequestSpec, SimConfig, SimEngine, StepResult, load_profile
from engines.sim.serving.launch import DEFAULT_PROFILE
from loadtests.routing.vtime.kv import to_router_batch
from loadtests.routing.vtime.records import Oracle, RequestRecord, RunResult, WorkerRecord
from loadtests.routing.vtime.sessions import Session, Turn
from router import Ranking, Router, RouterConfig, WorkerInfo
from router.index.hashing import root_hash
from router.telemetry.load import ScrapedMetrics

# A chooser ranks one request: the router's own policies, or an experiment's baseline. A salted
# session's requests are ranked with `cache_salt=` as well (the router's policies take it).
Chooser = Callable[..., Ranking]
_ARRIVE, _STEP, _OUTPUTS, _KV, _SCRAPE, _MAINTAIN = range(6)


def policy_chooser(policy: str) -> Chooser:
    def choose(router: Router, model: str, prompt: Sequence[int], session_key: str,
               cache_salt: str | None = None) -> Ranking:
        return router.rank(model, prompt, policy=policy, session_key=session_key or None, cache_salt=cache_salt)
    return choose


@dataclass(frozen=True, slots=True)
class FleetConfig:
    workers: int = 16
    profile: str = DEFAULT_PROFILE
    # Engine shape; None: the profile's (flags override profiles the same way live).
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    max_model_len: int = 8192
    vocab_size: int = 49152
    router: RouterConfig = field(default_factory=RouterConfig)
    kv_event_delay_s: float = 0.002  # step end -> the router applies its events (ZMQ + decode)
    request_delay_s: float = 0.0005  # gateway dispatch -> the engine has the request
    response_delay_s: float = 0.0005  # step end -> the gateway has its tokens
    scrape_interval_s: float = 1.0  # 0: no scrapes
    maintain_interval_s: float = 1.0
    wire_events: bool = False  # KV events through msgpack (exactly the subscriber's path; slower)
    model: str = "sim"

    def sim_config(self) -> SimConfig:
        profile = load_profile(self.profile)
        shape = dict(profile.engine)
        for key in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, key) is not None:
                shape[key] = getattr(self, key)
        return SimConfig(vocab_size=self.vocab_size, max_model_len=self.max_model_len, cost=profile.cost, **shape)


class VirtualFleet:
    """One run: build, `run(sessions, chooser)` once, read the result."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.now = 0.0
        sim = config.sim_config()
        self.block_size = sim.block_size
        self.engines = [SimEngine(sim) for _ in range(config.workers)]
        self.names = [f"sim-{i}" for i in range(config.workers)]
        self.router = Router(config.router, clock=lambda: self.now)
        for name in self.names:
            self.router.add_worker(WorkerInfo(name, f"http://{name}.invalid", (config.model,),
                                              block_size=sim.block_size, engine="sim",
                                              kv_events_endpoint=f"tcp://{name}.invalid:5557"))
        self._index = {name: i for i, name in enumerate(self.names)}
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._pending = [False] * config.workers  # a step of this engine is on the heap
        self._open = 0  # sessions not finished yet
        self._sessions: list[Session] = []
        self._outputs: dict[str, list[int]] = {}
        self._session_of: dict[str, tuple[int, int]] = {}  # request id -> (session, turn index)
        self.records: dict[str, RequestRecord] = {}
        self.worker_records = [WorkerRecord(n) for n in self.names]
        self.oracle = Oracle(self.block_size)
        self._root = root_hash(config.model)

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def run(self, sessions: Sequence[Session], chooser: Chooser) -> RunResult:
        started = time.perf_counter()
        self._sessions = list(sessions)
        self._open = len(self._sessions)
        self._chooser = chooser
        for i, s in enumerate(self._sessions):
            turn = s.next_turn(None)
            if turn is None:
                self._open -= 1
            else:
                self._push(s.start_s + turn.delay_s, _ARRIVE, (i, 0, turn))
        if self.config.scrape_interval_s > 0:
            for w in range(len(self.engines)):  # staggered, as independent scrape loops are
                self._push(self.config.scrape_interval_s * (w + 1) / len(self.engines), _SCRAPE, w)
        self._push(self.config.maintain_interval_s, _MAINTAIN, None)
        self._loop()
        return RunResult(list(self.records.values()), self.worker_records, self.oracle.hit_rate(),
                         self.now, time.perf_counter() - started)

    def _loop(self) -> None:
        heap = self._heap
        while heap and self._open > 0:
            t, _, kind, payload = heapq.heappop(heap)
            self.now = t
            if kind == _STEP:
                self._step(payload)  # type: ignore[arg-type]
            elif kind == _OUTPUTS:
                self._outputs_arrive(payload)  # type: ignore[arg-type]
            elif kind == _ARRIVE:
                self._arrive(*payload)  # type: ignore[misc]
            elif kind == _KV:
                w, ts, events = payload  # type: ignore[misc]
                self.router.feed.apply_kv_batch(self.names[w], to_router_batch(ts, events,
                                                                               wire=self.config.wire_events))
            elif kind == _SCRAPE:
                self._scrape(payload)  # type: ignore[arg-type]
            else:
                self.router.feed.maintain()
                self._push(t + self.config.maintain_interval_s, _MAINTAIN, None)

    def _arrive(self, session: int, turn_index: int, turn: Turn) -> None:
        s = self._sessions[session]
        rid = f"{s.key}/{turn_index}"
        prompt = turn.prompt
        t0 = time.perf_counter()
        if s.cache_salt is None:
            ranking = self._chooser(self.router, self.config.model, prompt, s.routing_key)
        else:
            ranking = self._chooser(self.router, self.config.model, prompt, s.routing_key, cache_salt=s.cache_salt)
        decision_s = time.perf_counter() - t0
        best = ranking.best
        self.router.on_dispatch(rid, ranking, best.worker)
        w = self._index[best.worker]
        self.oracle.observe(ranking, prompt, rid, self._root)
        self.records[rid] = RequestRecord(rid, s.key, turn.group, best.worker, self.now, len(prompt),
                                          turn.max_tokens, best.predicted_cached_tokens, decision_s,
                                          best.predicted_ttft_s, best.reason)
        self._session_of[rid] = (session, turn_index)
        self._outputs[rid] = []
        seed = xxhash.xxh64_intdigest(rid.encode()) & ((1 << 63) - 1)
        engine = self.engines[w]
        engine.add_request(RequestSpec(rid, prompt, turn.max_tokens, seed, ignore_eos=True, cache_salt=s.cache_salt),
                           self.now + self.config.request_delay_s)
        self._wake(w)

    def _wake(self, w: int) -> None:
        if self._pending[w]:
            return
        due = self.engines[w].next_event_time()
        if due is not None:
            self._pending[w] = True
            self._push(max(due, self.now), _STEP, w)

    def _step(self, w: int) -> None:
        self._pending[w] = False
        res: StepResult = self.engines[w].step(self.now)
        rec = self.worker_records[w]
        rec.busy_s += res.duration_s
        rec.prefill_tokens += res.prefill_tokens
        rec.decode_tokens += res.decode_seqs
        end = res.end_s
        if res.outputs:
            self._push(end + self.config.response_delay_s, _OUTPUTS, res.outputs)
        if res.kv_events:
            ts = time.time() - self.config.kv_event_delay_s  # the lag gauge reads wall clock
            self._push(end + self.config.kv_event_delay_s, _KV, (w, ts, res.kv_events))
        due = self.engines[w].next_event_time()
        if due is None or (res.idle and due <= self.now):
            return  # idle, or nothing fits until something arrives
        self._pending[w] = True
        self._push(max(due, end), _STEP, w)

    def _outputs_arrive(self, outputs: Sequence[object]) -> None:
        router = self.router
        for out in outputs:
            rid = out.request_id  # type: ignore[attr-defined]
            toks = self._outputs.get(rid)
            if toks is None:
                continue
            toks.extend(out.new_token_ids)  # type: ignore[attr-defined]
            rec = self.records[rid]
            if out.ttft_s is not None:  # type: ignore[attr-defined]
                router.on_first_token(rid)
                rec.first_token_s = self.now
            if out.finish_reason is not None:  # type: ignore[attr-defined]
                router.on_finish(rid, cached_tokens=out.cached_tokens,  # type: ignore[attr-defined]
                                 completion_tokens=len(toks))
                rec.finish_s = self.now
                rec.cached_tokens = out.cached_tokens  # type: ignore[attr-defined]
                rec.completion_tokens = len(toks)
                self._finished(rid)

    def _finished(self, rid: str) -> None:
        toks = self._outputs.pop(rid)
        session, turn_index = self._session_of.pop(rid)
        self.oracle.finished(rid, toks)
        turn = self._sessions[session].next_turn(toks)
        if turn is None:
            self._open -= 1
        else:
            self._push(self.now + turn.delay_s, _ARRIVE, (session, turn_index + 1, turn))

    def _scrape(self, w: int) -> None:
        engine = self.engines[w]
        snap = engine.snapshot()
        self.router.feed.apply_scrape(self.names[w], ScrapedMetrics(
            running=snap.running, waiting=snap.waiting, kv_usage=snap.kv_usage,
            block_size=engine.config.block_size, num_gpu_blocks=engine.config.num_gpu_blocks))
        self._push(self.now + self.config.scrape_interval_s, _SCRAPE, w)
