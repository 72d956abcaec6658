from __future__ import annotations

import pytest

from router.telemetry.health import BreakerState, CircuitBreaker, WorkerHealth
from router.telemetry.load import LoadTracker, ScrapedMetrics, parse_vllm_metrics


def test_breaker_opens_after_n_failures_and_half_opens_for_one_probe():
    b = CircuitBreaker(failure_threshold=3, cooldown_s=10, max_cooldown_s=40)
    b.record_failure(0)
    b.record_failure(1)
    assert b.state(1) is BreakerState.CLOSED
    b.record_success()  # consecutive failures only
    for t in (2, 3, 4):
        b.record_failure(t)
    assert b.state(5) is BreakerState.OPEN and not b.allows(5)
    assert b.allows(14) and b.state(14) is BreakerState.HALF_OPEN
    b.on_dispatch(14)
    assert not b.allows(14)  # one probe at a time
    b.record_failure(15)  # probe failed: open again, longer
    assert b.state(30) is BreakerState.OPEN and b.state(35) is BreakerState.HALF_OPEN
    b.on_dispatch(35)
    b.record_success()
    assert b.state(35) is BreakerState.CLOSED and b.allows(35)


def test_breaker_cooldown_is_capped():
    b = CircuitBreaker(1, 10, 15)
    b.record_failure(0)
    b.state(10)
    b.record_failure(10)  # 20 capped to 15
    assert b.state(24) is BreakerState.OPEN and b.state(25) is BreakerState.HALF_OPEN


def test_breaker_validates():
    with pytest.raises(ValueError):
        CircuitBreaker(0, 1, 1)
    with pytest.raises(ValueError):
        CircuitBreaker(1, 5, 1)


def test_health_checks_and_drain():
    h = WorkerHealth(2, CircuitBreaker(3, 1, 1))
    h.record_check(False)
    assert h.available(0)
    h.record_check(False)
    assert not h.available(0)
    h.record_check(True)
    assert h.available(0)
    h.draining = True
    assert not h.available(0)


def test_load_tracker_lifecycle():
    t = LoadTracker(stale_after_s=5)
    t.dispatch("a", "r1", 300)
    t.dispatch("a", "r2", 100)
    assert t.snapshot("a", 0).in_flight == 2 and t.snapshot("a", 0).queued_prefill_tokens == 400
    t.first_token("r1")
    t.first_token("r1")  # idempotent
    assert t.snapshot("a", 0).queued_prefill_tokens == 100
    assert t.finish("r2") == "a" and t.finish("r2") is None
    t.finish("r1")
    assert t.local("a") == (0, 0)
    t.set_remote("a", 3, 50)
    t.set_scraped("a", ScrapedMetrics(running=4, waiting=1, kv_usage=0.3), now=10)
    s = t.snapshot("a", 12)
    assert (s.in_flight, s.queued_prefill_tokens, s.running, s.kv_usage, s.requests) == (3, 50, 4, 0.3, 5)
    assert t.snapshot("a", 16).running is None  # stale scrape ignored


# Two engines (data-parallel ranks) in one exposition, to check the sums: the single-engine
# test workers cannot produce that. A real worker's exposition is parsed in
# tests/integration/vllm_pair/test_vllm_metrics_health.py.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",num_gpu_blocks="1820"} 1.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 384.0
"""


def test_parse_vllm_metrics():
    m = parse_vllm_metrics(VLLM_METRICS)
    assert m == ScrapedMetrics(running=4, waiting=2, kv_usage=0.25, block_size=128, num_gpu_blocks=1820)
    assert parse_vllm_metrics("") == ScrapedMetrics()
