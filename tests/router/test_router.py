from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from router import NoWorkerError, Router, RouterConfig, WorkerInfo
from router.index.events import decode_trtllm_events, decode_vllm_batch
from router.telemetry.health import BreakerState
from router.telemetry.load import ScrapedMetrics
from tests.router.index import eventgen as g


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(policy="prefix", events=False, **cfg):
    clock = Clock()
    reg = CollectorRegistry()
    r = Router(RouterConfig(policy=policy, **cfg), registry=reg, clock=clock)
    for n in ("w0", "w1"):
        r.add_worker(WorkerInfo(n, f"http://127.0.0.1:1/{n}", ("m",), block_size=4,
                                kv_events_endpoint="tcp://127.0.0.1:1" if events else None))
    return r, reg, clock


def sample(reg, name, labels=None):
    return reg.get_sample_value(name, labels or {})


SYSTEM = list(range(1, 13))  # 3 blocks of 4


def test_sequential_new_conversations_stay_where_the_system_prompt_is():
    # With nothing in flight, recomputing the shared prefix elsewhere is pure loss.
    r, _, _ = make()
    homes = set()
    for conv in range(6):
        rk = r.rank("m", SYSTEM + [100 + conv] * 5)
        homes.add(rk.best.worker)
        r.on_dispatch(f"c{conv}", rk, rk.best.worker)
        r.on_finish(f"c{conv}", cached_tokens=0)
    assert len(homes) == 1


def test_turns_follow_their_conversation():
    r, reg, _ = make()
    homes = {}
    for conv in range(6):  # concurrent first turns: queued prefill and in-flight spread them
        prompt = SYSTEM + [100 + conv] * 5
        rk = r.rank("m", prompt)
        homes[conv] = rk.best.worker
        r.on_dispatch(f"c{conv}", rk, rk.best.worker)
    for conv in range(6):
        r.on_finish(f"c{conv}", cached_tokens=0)
    assert set(homes.values()) == {"w0", "w1"}
    hits = {"policy": "prefix", "reason": "prefix_hit"}
    before = sample(reg, "sluice_router_decisions_total", hits) or 0
    for conv in range(6):
        rk = r.rank("m", SYSTEM + [100 + conv] * 5 + [7] * 6)
        assert rk.best.worker == homes[conv]
        assert rk.best.predicted_cached_tokens == 16  # 3 system blocks + 1 conversation block
        assert rk.best.reason == "prefix_hit"
    assert sample(reg, "sluice_router_decisions_total", hits) - before == 6


def test_closed_loop_metrics():
    r, reg, _ = make()
    rk = r.rank("m", [*SYSTEM, 5])
    r.on_dispatch("a", rk, "w0")
    r.on_finish("a", cached_tokens=0)
    rk = r.rank("m", [*SYSTEM, 5])
    assert rk.best.worker == "w0" and rk.best.predicted_cached_tokens == 12
    r.on_dispatch("b", rk, "w0")
    r.on_first_token("b")
    r.on_finish("b", cached_tokens=0)  # engine says 0 (e.g. evicted): off by 3 blocks
    assert sample(reg, "sluice_router_predicted_cached_tokens_total") == 12
    assert sample(reg, "sluice_router_reported_cached_tokens_total") == 0
    assert sample(reg, "sluice_router_predictions_total", {"outcome": "over"}) == 1
    assert sample(reg, "sluice_router_prediction_accuracy_ratio") == 0.5
    r.on_finish("unknown", cached_tokens=3)  # ignored


def test_failover_rolls_back_speculation_and_feeds_breaker():
    r, _, clock = make(breaker_failures=2, breaker_cooldown_s=5, breaker_max_cooldown_s=5)
    prompt = [*SYSTEM, 9]
    rk = r.rank("m", prompt)
    first, second = rk.candidates[0].worker, rk.candidates[1].worker
    r.on_dispatch("x", rk, first)
    r.on_finish("x", error=True)
    r.on_dispatch("x", rk, second)
    r.on_finish("x", cached_tokens=0)
    rk2 = r.rank("m", prompt)
    assert rk2.best.worker == second  # the failed worker did not keep the prefix
    # Two failures open the breaker: the worker drops to the end as degraded.
    for i in range(2):
        r.on_dispatch(f"f{i}", rk, first)
        r.on_finish(f"f{i}", error=True)
    rk3 = r.rank("m", [50] * 3)
    assert rk3.candidates[-1].worker == first and rk3.candidates[-1].reason == "degraded"
    clock.t += 5  # cooldown over: half-open, available for one probe
    assert r.rank("m", [50] * 3).candidate(first).reason != "degraded"


def test_a_worker_lost_mid_answer_is_marked_down_until_a_check_passes():
    r, _, clock = make(breaker_failures=5, breaker_cooldown_s=5, breaker_max_cooldown_s=5)
    rk = r.rank("m", [50] * 3)
    lost = rk.best.worker
    r.on_dispatch("x", rk, lost)
    r.on_first_token("x")  # it was serving: a sign of life that excuses a missed check, until it is lost
    r.mark_down(lost)
    r.mark_down("never-registered")  # ignored
    status = {s.name: s for s in r.workers()}[lost]
    assert not status.healthy and status.breaker is BreakerState.OPEN
    assert r.rank("m", [60] * 3).candidates[-1].worker == lost
    clock.t += 1
    r.feed.record_health_check(lost, True)
    assert {s.name: s for s in r.workers()}[lost].healthy


def test_a_resumed_answer_is_no_ttft_observation():
    r, reg, clock = make()
    rk = r.rank("m", SYSTEM)
    r.on_dispatch("x~1", rk, "w0", resume=True)
    clock.t += 3.0  # the prefill of the answer so far
    r.on_first_token("x~1")
    assert sample(reg, "sluice_router_actual_ttft_seconds_count", {"worker": "w0"}) in (None, 0.0)
    assert {s.name: s.in_flight for s in r.workers()}["w0"] == 1
    r.on_finish("x~1", completion_tokens=5)
    assert {s.name: s.in_flight for s in r.workers()}["w0"] == 0


def test_dispatch_twice_without_finish_releases_the_first_attempt():
    r, _, _ = make()
    rk = r.rank("m", SYSTEM)
    r.on_dispatch("x", rk, "w0")
    r.on_dispatch("x", rk, "w1")
    assert {s.name: s.in_flight for s in r.workers()} == {"w0": 0, "w1": 1}


def test_load_shifts_new_conversations():
    r, _, _ = make()
    for i in range(4):
        rk = r.rank("m", [200 + i] * 8)
        r.on_dispatch(f"busy{i}", rk, "w0")
    assert r.rank("m", [999] * 8).best.worker == "w1"


def test_drain_remove_and_unknown_model():
    r, _, _ = make()
    r.drain("w0")
    assert [c.worker for c in r.rank("m", SYSTEM).candidates] == ["w1"]
    r.drain("w0", False)
    r.remove_worker("w1")
    assert [c.worker for c in r.rank("m", SYSTEM).candidates] == ["w0"]
    with pytest.raises(NoWorkerError):
        r.rank("other", SYSTEM)
    with pytest.raises(ValueError):
        r.rank("m", SYSTEM, policy="nope")
    assert r.models() == ["m"]


def test_salts_do_not_share_cache():
    r, _, _ = make()
    rk = r.rank("m", [*SYSTEM, 1], cache_salt="tenant-a")
    r.on_dispatch("a", rk, rk.best.worker)
    r.on_finish("a")
    assert r.rank("m", [*SYSTEM, 1], cache_salt="tenant-a").best.predicted_cached_tokens == 12
    assert r.rank("m", [*SYSTEM, 1], cache_salt="tenant-b").best.predicted_cached_tokens == 0
    assert r.rank("m", [*SYSTEM, 1], lora="x").best.predicted_cached_tokens == 0


def test_speculative_entries_expire():
    r, _, clock = make(speculative_ttl_s=10, events=True)
    rk = r.rank("m", [*SYSTEM, 1])
    r.on_dispatch("a", rk, "w0")
    assert r.rank("m", [*SYSTEM, 1]).candidate("w0").predicted_cached_tokens == 12
    clock.t += 11
    assert r.rank("m", [*SYSTEM, 1]).candidate("w0").predicted_cached_tokens == 0


def test_events_make_entries_exact_and_removals_apply():
    r, reg, clock = make(speculative_ttl_s=10, events=True)
    ev = g.stored([b"h1", b"h2", b"h3"], None, SYSTEM, 4)
    r.feed.apply_kv_batch("w1", decode_vllm_batch(g.batch([ev])))
    clock.t += 1e6  # exact entries do not expire
    rk = r.rank("m", [*SYSTEM, 1])
    assert rk.best.worker == "w1" and rk.best.predicted_cached_tokens == 12
    r.feed.apply_kv_batch("w1", decode_vllm_batch(g.batch([g.removed([b"h2"])])))
    assert r.rank("m", [*SYSTEM, 1]).candidate("w1").predicted_cached_tokens == 4
    assert sample(reg, "sluice_router_kv_events_total", {"worker": "w1"}) == 2
    r.feed.reset_kv_state("w1", "gap")
    assert r.rank("m", [*SYSTEM, 1]).candidate("w1").predicted_cached_tokens == 0


def test_block_size_and_capacity_learned_from_metrics():
    r = Router(RouterConfig(approx_capacity_blocks=100), clock=Clock())
    r.add_worker(WorkerInfo("w", "http://127.0.0.1:1", ("m",)))
    assert r.workers()[0].block_size == 128
    r.feed.apply_scrape("w", ScrapedMetrics(block_size=16, num_gpu_blocks=2))
    assert r.workers()[0].block_size == 16
    rk = r.rank("m", list(range(64)))
    r.on_dispatch("a", rk, "w")
    assert r.workers()[0].index_blocks == 2  # modelled LRU capacity of 2 blocks


def test_policy_per_request_and_gauges():
    r, reg, _ = make(policy="round_robin")
    seen = {r.rank("m", SYSTEM).best.worker for _ in range(4)}
    assert seen == {"w0", "w1"}
    assert r.rank("m", SYSTEM, policy="session", session_key="s").best.reason == "session"
    r.feed.maintain()
    assert sample(reg, "sluice_router_worker_healthy", {"worker": "w0"}) == 1
    r.remove_worker("w0")
    assert sample(reg, "sluice_router_worker_healthy", {"worker": "w0"}) is None


def test_feed_counts_gaps_and_ignores_unknown_workers():
    r, reg, _ = make(events=True)
    r.feed.record_kv_gap("w0", True)
    r.feed.record_kv_gap("w0", False)
    assert sample(reg, "sluice_router_kv_event_gaps_total", {"worker": "w0"}) == 2
    assert sample(reg, "sluice_router_kv_event_replays_total", {"worker": "w0"}) == 1
    # A report racing a removal must not bring the removed worker's series back.
    r.remove_worker("w1")
    r.feed.apply_kv_batch("w1", decode_vllm_batch(g.batch([g.stored([b"h1"], None, SYSTEM[:4], 4)])))
    r.feed.record_kv_gap("w1", True)
    r.feed.apply_scrape("w1", ScrapedMetrics(running=1))
    r.feed.record_health_check("w1", False)
    assert sample(reg, "sluice_router_kv_event_lag_seconds", {"worker": "w1"}) is None
    assert sample(reg, "sluice_router_kv_event_gaps_total", {"worker": "w1"}) is None
    assert [s.name for s in r.workers()] == ["w0"]


def _trtllm_stored(block_hash: int, parent: int | None, tokens: list[int]) -> list:
    """One `stored` item of trtllm-serve's /kv_cache_events, decoded as the poller decodes it."""
    body = [{"event_id": block_hash, "window_size": 4, "data": {"type": "stored", "parent_hash": parent, "blocks": [
        {"type": "stored_block", "block_hash": block_hash, "cache_level": 0, "priority": 35,
         "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens]}]}}]
    return [ev for _, ev in decode_trtllm_events(body)]


def test_a_worker_that_takes_no_salt_is_matched_unsalted_for_a_salted_request():
    """Mixed dialects: TRT-LLM is sent no cache_salt, so its cache (and its events) are unsalted and a
    keyed request matches them; a vLLM worker's blocks match only under the request's own salt."""
    r = Router(RouterConfig(), clock=Clock())
    r.add_worker(WorkerInfo("vllm", "http://127.0.0.1:1", ("m",), block_size=4,
                            kv_events_endpoint="tcp://127.0.0.1:1"))
    r.add_worker(WorkerInfo("trt", "http://127.0.0.1:2", ("m",), block_size=4, engine="trtllm",
                            trtllm_events=True, salted_cache=False))
    r.feed.apply_kv_events("trt", [*_trtllm_stored(1, None, SYSTEM[:4]), *_trtllm_stored(2, 1, SYSTEM[4:8])])
    r.feed.apply_kv_batch("vllm", decode_vllm_batch(g.batch([g.stored([b"h1", b"h2", b"h3"], None, SYSTEM, 4)])))
    keyed = r.rank("m", [*SYSTEM, 1], cache_salt="tenant-a")
    assert keyed.candidate("trt").predicted_cached_tokens == 8  # its unsalted events
    assert keyed.candidate("vllm").predicted_cached_tokens == 0  # unsalted blocks are not tenant-a's
    salted = g.stored([b"s1", b"s2", b"s3"], None, SYSTEM, 4, extra_keys=[["tenant-a"], None, None])
    r.feed.apply_kv_batch("vllm", decode_vllm_batch(g.batch([salted])))
    keyed = r.rank("m", [*SYSTEM, 1], cache_salt="tenant-a")
    assert keyed.candidate("vllm").predicted_cached_tokens == 12
    assert r.rank("m", [*SYSTEM, 1], cache_salt="tenant-b").candidate("vllm").predicted_cached_tokens == 0
    # A keyed dispatch to the unsalted worker adds its speculative entries on the unsalted chain too.
    r.on_dispatch("a", keyed, "trt")
    assert r.rank("m", [*SYSTEM, 1], cache_salt="tenant-b").candidate("trt").predicted_cached_tokens == 12


def test_a_busy_worker_that_misses_its_checks_stays_available_a_silent_one_does_not():
    """A failed health check of a worker that just delivered a first token or a whole answer is
    excused (it is busy, not dead); once it has been silent for a check interval and a timeout the
    failures count again, and a client disconnect is no proof of life."""
    r, reg, clock = make(health_interval_s=5.0, health_timeout_s=2.0, unhealthy_after_failures=2)
    names = [s.name for s in r.workers()]
    assert names == ["w0", "w1"]
    rk = r.rank("m", SYSTEM)
    r.on_dispatch("a", rk, "w0")
    clock.t += 1
    r.on_first_token("a")
    for _ in range(3):  # within 7 s of the first token
        clock.t += 2
        r.feed.record_health_check("w0", False)
    assert {s.name: s.healthy for s in r.workers()}["w0"]
    assert sample(reg, "sluice_router_health_checks_excused_total", {"worker": "w0"}) == 3
    r.on_finish("a", cached_tokens=0, completion_tokens=5)
    clock.t += 7
    r.feed.record_health_check("w0", False)  # 7 s after the answer: still excused
    clock.t += 0.5
    r.feed.record_health_check("w0", False)
    r.feed.record_health_check("w0", False)
    assert not {s.name: s.healthy for s in r.workers()}["w0"]
    # The other worker: a request that ended by a disconnect (no completion) proves nothing.
    rk = r.rank("m", SYSTEM)
    r.on_dispatch("b", rk, "w1")
    r.on_finish("b")
    r.feed.record_health_check("w1", False)
    r.feed.record_health_check("w1", False)
    assert not {s.name: s.healthy for s in r.workers()}["w1"]
    assert sample(reg, "sluice_router_health_checks_excused_total", {"worker": "w1"}) == 0
