from __future__ import annotations

import pytest

from router import (
    COST_PARAMETERS,
    DEFAULT_POLICY,
    POLICIES,
    REDIS_URL_SCHEMES,
    LearningConfig,
    RedisStateConfig,
    RouterConfig,
    TtftModel,
    WorkerInfo,
    validate_redis_url,
)
from router.policies import WorkerView, rank
from router.telemetry.load import LoadSnapshot


def test_router_config_validation():
    with pytest.raises(ValueError):
        RouterConfig(policy="fastest")
    with pytest.raises(ValueError):
        RouterConfig(speculative_ttl_s=0)
    with pytest.raises(ValueError):
        WorkerInfo("has space", "http://x", ("m",))
    with pytest.raises(ValueError):
        WorkerInfo("w", "127.0.0.1:8000", ("m",))
    with pytest.raises(ValueError):
        WorkerInfo("w", "http://x", ("m",), kv_events_endpoint="tcp://x:1", trtllm_events=True)


def test_session_header_is_a_lower_case_header_name():
    assert RouterConfig().session_header == "x-session-id"
    assert RouterConfig(session_header="x-conversation").session_header == "x-conversation"
    for bad in ("X-Session-Id", "", "x session", "x-session:", "x-sessión"):
        with pytest.raises(ValueError, match="session_header"):
            RouterConfig(session_header=bad)


def test_every_policy_name_ranks():
    views = [WorkerView("a", 0, LoadSnapshot()), WorkerView("b", 0, LoadSnapshot())]
    assert DEFAULT_POLICY in POLICIES
    for policy in POLICIES:
        RouterConfig(policy=policy)
        assert len(rank(policy, views, prompt_tokens=8, tie_key=1, session_key="s")) == 2


def test_cost_parameters_are_the_models_fields_and_are_never_negative():
    assert COST_PARAMETERS == ("latency_s", "running_s", "token_s", "pair_s")
    for name in COST_PARAMETERS:
        TtftModel(**{name: 0.0})
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match=name):
                TtftModel(**{name: bad})


def test_learning_config_validation():
    with pytest.raises(ValueError, match="memory"):
        LearningConfig(worker_memory=1)
    with pytest.raises(ValueError, match="prior_weight"):
        LearningConfig(worker_prior_weight=-1)


def test_redis_urls():
    for url in ("redis://127.0.0.1:6379/0", "rediss://cache.internal:6380", "unix:///run/redis.sock"):
        assert validate_redis_url(url) == url
        assert RedisStateConfig(url=url).url == url
    assert [s.rstrip("/:") for s in REDIS_URL_SCHEMES] == ["redis", "rediss", "unix"]
    for bad in ("http://127.0.0.1:6379", "127.0.0.1:6379", "redis://", ""):
        with pytest.raises(ValueError, match="redis url"):
            validate_redis_url(bad)
        with pytest.raises(ValueError, match="redis url"):
            RedisStateConfig(url=bad)
