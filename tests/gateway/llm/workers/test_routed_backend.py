"""RoutedBackend.rank: the router's ranking becomes the dispatch's targets. In-process:
a real `router.Router` that is never started (no health checks, no scrapes, no network),
or a scripted one, and fake engines in the pool."""

from __future__ import annotations

from typing import Any

import pytest

from engines.errors import ErrorKind, SluiceError
from engines.launchers.registration import WorkerRecord
from gateway.llm.admission import AdmissionConfig
from gateway.llm.registry import ModelRegistry
from gateway.llm.targets import RouteHints, Target
from gateway.llm.workers.pool import RoutedBackend, WorkerPool, worker_info
from router import Candidate, NoWorkerError, Ranking, Router, RouterConfig, WorkerInfo
from router.index.events import BlockStored
from tests.gateway.llm.fakes import FakeEngine, request

PROMPT = list(range(100, 116))  # four blocks of 4 tokens


class ScriptedRouter:
    """Answers `rank` with a fixed ranking (or error) and records every call the backend makes."""

    def __init__(self, ranking: Ranking | None = None, error: Exception | None = None) -> None:
        self.ranking, self.error = ranking, error
        self.calls: list[tuple[Any, ...]] = []

    def rank(self, model: str, token_ids: list[int], **kw: Any) -> Ranking:
        self.calls.append(("rank", model, list(token_ids), kw))
        if self.error is not None:
            raise self.error
        assert self.ranking is not None
        return self.ranking

    def on_dispatch(self, request_id: str, ranking: Ranking, worker: str, *, resume: bool = False) -> None:
        self.calls.append(("on_dispatch", request_id, ranking, worker, *(("resume",) if resume else ())))

    def on_first_token(self, request_id: str) -> None:
        self.calls.append(("on_first_token", request_id))

    def on_finish(self, request_id: str, **kw: Any) -> None:
        self.calls.append(("on_finish", request_id, kw))

    def mark_down(self, worker: str) -> None:
        self.calls.append(("mark_down", worker))


def _pool(router: Any, *engines: str) -> WorkerPool:
    pool = WorkerPool(ModelRegistry(AdmissionConfig()), router, None)
    for name in engines:
        pool.engines[name] = FakeEngine(name)
    return pool


def _router(*workers: str, **config: Any) -> Router:
    """A real router, never started, over workers serving `m` in blocks of 4 tokens, on a still clock
    (speculative index entries do not expire during a test)."""
    r = Router(RouterConfig(**config), clock=lambda: 1000.0)
    for name in workers:
        r.add_worker(WorkerInfo(name, "http://127.0.0.1:9", ("m",), block_size=4))
    return r


def _names(targets: list[Target]) -> list[str]:
    return [t.name for t in targets]


def test_targets_keep_the_router_order_and_skip_workers_without_an_engine() -> None:
    ranking = Ranking("m", "prefix", len(PROMPT), (
        Candidate("w3", 8, 0.1, "prefix_hit"), Candidate("w1", 0, 0.2, "load"),
        Candidate("gone", 0, 0.3, "load"),  # ranked, but no longer in the pool
        Candidate("w2", 0, 0.4, "degraded"),
    ))
    router = ScriptedRouter(ranking)
    pool = _pool(router, "w1", "w2", "w3")
    req = request("r-0", prompt=PROMPT)
    req.lora, req.cache_salt = "adapter", "salt"
    targets = RoutedBackend("m", pool).rank(req, RouteHints(policy="prefix", session_key="s1"))
    assert _names(targets) == ["w3", "w1", "w2"]
    assert [(t.predicted_cached_tokens, t.reason) for t in targets] == [(8, "prefix_hit"), (0, "load"),
                                                                        (0, "degraded")]
    assert all(t.engine is pool.engines[t.name] for t in targets)
    assert router.calls == [("rank", "m", PROMPT, {"policy": "prefix", "session_key": "s1", "lora": "adapter",
                                                     "cache_salt": "salt"})]


def test_target_hooks_report_to_the_router_for_their_worker() -> None:
    ranking = Ranking("m", "prefix", len(PROMPT), (Candidate("w1", 0, 0.1, "no_prefix"),
                                                   Candidate("w2", 0, 0.2, "no_prefix")))
    router = ScriptedRouter(ranking)
    targets = RoutedBackend("m", _pool(router, "w1", "w2")).rank(request("r-0", prompt=PROMPT), RouteHints())
    router.calls.clear()
    for t, (cached, fault, answered) in zip(targets, [(None, True, None), (4, False, 9)], strict=True):
        assert t.on_dispatch is not None and t.on_first_token is not None and t.on_finish is not None
        t.on_dispatch()
        t.on_first_token()
        t.on_finish(cached, fault, answered)
    assert router.calls == [
        ("on_dispatch", "r-0", ranking, "w1"), ("on_first_token", "r-0"),
        ("on_finish", "r-0", {"cached_tokens": None, "error": True, "completion_tokens": None}),
        ("on_dispatch", "r-0", ranking, "w2"), ("on_first_token", "r-0"),
        ("on_finish", "r-0", {"cached_tokens": 4, "error": False, "completion_tokens": 9}),
    ]


def test_a_resume_is_dispatched_as_one_and_a_lost_worker_is_marked_down() -> None:
    ranking = Ranking("m", "prefix", len(PROMPT), (Candidate("w1", 0, 0.1, "no_prefix"),))
    router = ScriptedRouter(ranking)
    [target] = RoutedBackend("m", _pool(router, "w1")).rank(request("r-0~1", prompt=PROMPT), RouteHints(resume=True))
    router.calls.clear()
    assert target.on_dispatch is not None and target.on_lost is not None
    target.on_dispatch()
    target.on_lost()
    assert router.calls == [("on_dispatch", "r-0~1", ranking, "w1", "resume"), ("mark_down", "w1")]


@pytest.mark.parametrize(("error", "kind", "param"), [
    (NoWorkerError("no worker serves model 'm'"), ErrorKind.NO_WORKER, None),
    (ValueError("unknown routing policy 'fastest'"), ErrorKind.INVALID_ARG, "X-Routing-Policy"),
])
def test_router_refusals_become_domain_errors(error: Exception, kind: ErrorKind, param: str | None) -> None:
    backend = RoutedBackend("m", _pool(ScriptedRouter(error=error), "w1"))
    with pytest.raises(SluiceError) as refused:
        backend.rank(request("r-0", prompt=PROMPT), RouteHints())
    assert refused.value.kind is kind and refused.value.param == param
    assert str(error) in refused.value.message


def test_no_registered_worker_is_no_worker_with_retry_after() -> None:
    backend = RoutedBackend("m", _pool(_router()))
    with pytest.raises(SluiceError) as refused:
        backend.rank(request("r-0", prompt=PROMPT), RouteHints())
    assert refused.value.kind is ErrorKind.NO_WORKER and refused.value.retry_after_s == 1.0


def test_workers_known_to_the_router_but_not_the_pool_are_no_worker() -> None:
    backend = RoutedBackend("m", _pool(_router("w1", "w2")))  # registered, but their engines are gone
    with pytest.raises(SluiceError) as refused:
        backend.rank(request("r-0", prompt=PROMPT), RouteHints())
    assert refused.value.kind is ErrorKind.NO_WORKER and "no healthy worker" in refused.value.message


def test_unknown_policy_from_a_real_router_is_invalid_arg() -> None:
    backend = RoutedBackend("m", _pool(_router("w1"), "w1"))
    with pytest.raises(SluiceError) as refused:
        backend.rank(request("r-0", prompt=PROMPT), RouteHints(policy="fastest"))
    assert refused.value.kind is ErrorKind.INVALID_ARG and refused.value.param == "X-Routing-Policy"


def test_unhealthy_workers_come_last_and_draining_ones_not_at_all() -> None:
    router = _router("w1", "w2", "w3")
    for _ in range(router.config.unhealthy_after_failures):
        router.feed.record_health_check("w1", ok=False)
    router.drain("w2")
    targets = RoutedBackend("m", _pool(router, "w1", "w2", "w3")).rank(request("r-0", prompt=PROMPT),
                                                                        RouteHints())
    # An unhealthy worker stays as a last resort (better than failing outright); a draining one is out.
    assert _names(targets) == ["w3", "w1"]
    assert targets[-1].reason == "degraded"


def test_only_draining_workers_is_no_worker() -> None:
    router = _router("w1")
    router.drain("w1")
    with pytest.raises(SluiceError) as refused:
        RoutedBackend("m", _pool(router, "w1")).rank(request("r-0", prompt=PROMPT), RouteHints())
    assert refused.value.kind is ErrorKind.NO_WORKER


def test_a_dispatch_through_the_hooks_makes_its_worker_the_prefix_hit() -> None:
    router = _router("w1", "w2", "w3")
    backend = RoutedBackend("m", _pool(router, "w1", "w2", "w3"))
    first = backend.rank(request("r-0", prompt=PROMPT), RouteHints())
    assert {t.reason for t in first} == {"no_prefix"}
    chosen = first[-1]  # send it to the last-ranked worker, as a failover would
    assert chosen.on_dispatch is not None and chosen.on_finish is not None
    chosen.on_dispatch()
    chosen.on_finish(None, False, None)
    again = backend.rank(request("r-1", prompt=PROMPT), RouteHints())
    assert again[0].name == chosen.name
    assert again[0].reason == "prefix_hit" and again[0].predicted_cached_tokens > 0


def test_a_worker_fault_reported_through_the_hooks_opens_its_breaker() -> None:
    router = _router("w1", "w2", breaker_failures=1)
    backend = RoutedBackend("m", _pool(router, "w1", "w2"))
    best = backend.rank(request("r-0", prompt=PROMPT), RouteHints())[0]
    assert best.on_dispatch is not None and best.on_finish is not None
    best.on_dispatch()
    best.on_finish(None, True, None)
    again = backend.rank(request("r-1", prompt=PROMPT), RouteHints())
    assert _names(again)[-1] == best.name and again[-1].reason == "degraded"
    assert again[0].predicted_cached_tokens == 0  # the failed attempt's speculative entries are gone


def test_a_keyed_request_is_matched_on_each_workers_own_chain() -> None:
    """The tenant's salt reaches vLLM and sim workers only (engines.remote.payload): a TRT-LLM or plain
    OpenAI worker caches, and reports events, under the unsalted chain, which a keyed request matches."""
    router = _router()
    for engine in ("vllm", "sim", "trtllm", "transformers", "openai"):
        record = WorkerRecord(name=engine, url="http://127.0.0.1:9", engine=engine, block_size=4)
        router.add_worker(worker_info(record, ("m",)))
    for name in ("vllm", "trtllm", "transformers"):
        router.feed.apply_kv_events(name, [BlockStored((1, 2), None, tuple(PROMPT[:8]), 4)])
    req = request("r-0", prompt=PROMPT)
    req.cache_salt = "tenant-a"
    backend = RoutedBackend("m", _pool(router, "vllm", "sim", "trtllm", "transformers", "openai"))
    cached = {t.name: t.predicted_cached_tokens for t in backend.rank(req, RouteHints())}
    assert cached == {"vllm": 0, "sim": 0, "trtllm": 8, "transformers": 8, "openai": 0}
    salted = req.cache_salt  # the same blocks stored under the tenant's salt, as vLLM reports them
    router.feed.apply_kv_events("vllm", [BlockStored((3, 4), None, tuple(PROMPT[:8]), 4, extra_keys=((salted,), None))])
    assert {t.name: t.predicted_cached_tokens for t in backend.rank(req, RouteHints())}["vllm"] == 8
