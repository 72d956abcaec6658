"""The routing cost in seconds: its terms (router.cost), the online fit (router.fit), what the
learner recovers from observed TTFTs (router.learning), and the series the router exports for it."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from router import LearningConfig, Router, RouterConfig, TtftModel, WorkerInfo
from router.cost import KvPressure, TtftFeatures, attention_pairs, eviction_s, predict_ttft, queue_s
from router.fit import LinearFit
from router.learning import CostLearner
from router.state_metrics import imbalance
from router.telemetry.load import LoadSnapshot
from tests.router.test_router import Clock


def test_attention_pairs_count_query_key_pairs() -> None:
    # 3 new tokens after 2 cached: token i attends to 2 + i keys -> 3 + 4 + 5.
    assert attention_pairs(3, 2) == 12
    assert attention_pairs(0, 100) == 0
    assert attention_pairs(1, 0) == 1


def test_predict_and_queue_terms() -> None:
    m = TtftModel(latency_s=0.01, running_s=0.002, token_s=1e-4, pair_s=1e-8)
    f = TtftFeatures(running=3, tokens=1000, pairs=500_000)
    assert predict_ttft(m, f) == pytest.approx(0.01 + 0.006 + 0.1 + 0.005)
    load = LoadSnapshot(queued_prefill_tokens=200, in_flight=2, queued_prefill_pairs=10_000)
    assert queue_s(m, load) == pytest.approx(0.002 * 2 + 1e-4 * 200 + 1e-8 * 10_000)


def test_eviction_term_prices_only_blocks_beyond_the_free_ones() -> None:
    m = TtftModel(token_s=1e-3)
    kv = KvPressure(free_blocks=2, refill_ratio=0.5, block_size=16)
    assert eviction_s(m, kv, 32) == 0.0  # 2 blocks fit in the free ones
    # 50 tokens need 4 blocks: 2 evicted, each refilled half the time at 16 tokens x 1 ms.
    assert eviction_s(m, kv, 50) == pytest.approx(2 * 0.5 * 16 * 1e-3)
    assert eviction_s(m, None, 50) == 0.0
    assert eviction_s(m, KvPressure(0, 0.0, 16), 50) == 0.0


def test_fit_recovers_coefficients_and_keeps_them_nonnegative() -> None:
    rng = random.Random(1)
    fit = LinearFit(3, memory=10_000)
    true = (0.5, 2.0, -0.3)  # the third would be negative: the fit holds it at 0
    for _ in range(400):
        x = (1.0, rng.uniform(0, 10), rng.uniform(0, 1))
        y = sum(a * b for a, b in zip(true, x, strict=True)) + rng.gauss(0, 0.01)
        fit.observe(x, y)
    theta = fit.solve((0.0, 0.0, 0.0), prior_weight=0.0)
    assert theta[2] == 0.0
    assert theta[1] == pytest.approx(2.0, abs=0.02)
    assert theta[0] == pytest.approx(0.5 - 0.3 * 0.5, abs=0.05)  # the clipped term's mean moves to the constant
    # A prior pulls towards itself, never past it.
    shrunk = fit.solve((0.0, 0.0, 0.0), prior_weight=50.0)
    assert 0.0 < shrunk[1] < theta[1]


def test_a_prior_far_off_the_data_does_not_outweigh_it() -> None:
    """A prior set for other hardware (here 100 times too slow per token) weighs like one
    observation it misses by 100%, not like one whose error is the 100-fold term itself."""
    rng = random.Random(4)
    fit = LinearFit(3, memory=10_000)
    for _ in range(300):
        n, pairs = rng.randint(100, 8000), rng.randint(0, 40_000_000)
        y = 0.005 + 1e-5 * n + 2e-9 * pairs
        fit.observe((1.0, n, pairs), y, 1.0 / y**2)
    latency, token, pair = fit.solve((0.0, 1e-3, 0.0), prior_weight=1.0)
    assert latency == pytest.approx(0.005, rel=0.05)
    assert token == pytest.approx(1e-5, rel=0.02)
    assert pair == pytest.approx(2e-9, rel=0.05)


def test_fit_without_observations_is_the_prior() -> None:
    fit = LinearFit(2, memory=8)
    assert fit.solve((0.25, 3.0), prior_weight=5.0) == (0.25, 3.0)
    with pytest.raises(ValueError):
        LinearFit(0, memory=8)


def _true_ttft(f: TtftFeatures, speed: float) -> float:
    return speed * (0.005 + 0.001 * f.running + 1e-5 * f.tokens + 2e-9 * f.pairs)


def test_learner_learns_the_fleets_coefficients_and_each_workers_speed() -> None:
    # A light prior on the speeds (1 observation's worth) so that they are their data's.
    learner = CostLearner(LearningConfig(prior=TtftModel(token_s=1e-3), worker_prior_weight=1.0))
    rng = random.Random(2)
    speeds = {"fast": 1.0, "slow": 2.0}  # the slow machine takes twice as long for everything
    for _ in range(400):
        for w, speed in speeds.items():
            n = rng.randint(100, 8000)
            f = TtftFeatures(rng.choice((0, 0, 1, 4, 8)), n, attention_pairs(n, rng.randint(0, 4000)))
            learner.observe_ttft(w, f, _true_ttft(f, speed), predict_ttft(learner.model(w), f))
    assert learner.speed("slow") / learner.speed("fast") == pytest.approx(2.0, rel=0.05)
    for w, speed in speeds.items():
        for f in (TtftFeatures(0, 5000, attention_pairs(5000, 0)), TtftFeatures(0, 2000, attention_pairs(2000, 3000))):
            assert predict_ttft(learner.model(w), f) == pytest.approx(_true_ttft(f, speed), rel=0.05)
    # A worker never observed starts where the fleet is, between the two, not at the 1e-3 prior.
    assert learner.speed("new") == 1.0
    assert 1e-5 < learner.model("new").token_s < 2e-5
    assert 0.0 < learner.relative_error < 1.0


def test_a_workers_speed_is_learned_only_from_requests_it_ran_alone() -> None:
    """Requests that queued behind others say how the queue went as much as how fast the worker
    is; a worker whose queued requests happened to beat the fleet's prediction must not look
    faster for it (the router would then send it ever more, and it would look faster still)."""
    learner = CostLearner(LearningConfig())
    rng = random.Random(3)
    for _ in range(300):
        for w in ("a", "b"):
            n = rng.randint(100, 8000)
            alone = TtftFeatures(0, n, attention_pairs(n, 0))
            learner.observe_ttft(w, alone, _true_ttft(alone, 1.0), predict_ttft(learner.model(w), alone))
        queued = TtftFeatures(6, 20_000, attention_pairs(20_000, 0))
        learner.observe_ttft("b", queued, 0.5 * _true_ttft(queued, 1.0), predict_ttft(learner.model("b"), queued))
    assert learner.speed("b") == pytest.approx(learner.speed("a"), rel=0.02)
    assert learner.observations("b") == 600


def test_refill_ratio_counts_evicted_blocks_stored_again() -> None:
    learner = CostLearner(LearningConfig())
    assert learner.refill_ratio("w") == 0.0
    learner.evicted("w", [1, 2, 3, 4])
    learner.stored("w", [1, 2, 9])
    assert learner.refill_ratio("w") == pytest.approx(0.5)
    learner.stored("w", [1])  # already refilled: not counted twice
    assert learner.refill_ratio("w") == pytest.approx(0.5)


def test_answer_length_is_a_mean_per_model_that_forgets_at_the_workers_rate() -> None:
    learner = CostLearner(LearningConfig(worker_memory=4))
    assert learner.answer_tokens("m") == 0.0
    for n in (10, 20, 30):
        learner.observe_answer("m", n)
    assert learner.answer_tokens("m") == pytest.approx(20.0)  # the plain mean, under memory
    assert learner.answer_tokens("other") == 0.0
    for _ in range(40):
        learner.observe_answer("m", 100)
    assert learner.answer_tokens("m") == pytest.approx(100.0, rel=1e-4)  # the old ones forgotten
    learner.observe_answer("m", -5)  # clamped, not trusted
    learner.observe_answer("m", 10**12)
    assert 0.0 <= learner.answer_tokens("m") <= (1 << 20)


def test_the_router_learns_answer_lengths_only_from_answers_that_ran_to_their_end() -> None:
    clock = Clock()
    r = Router(RouterConfig(), registry=CollectorRegistry(), clock=clock)
    r.add_worker(WorkerInfo("w0", "http://127.0.0.1:1/w0", ("m",), block_size=4))
    for rid, kwargs in (("a", {"completion_tokens": 40}), ("b", {"completion_tokens": 7, "error": True}),
                        ("c", {}), ("d", {"completion_tokens": 60})):
        rk = r.rank("m", list(range(1, 9)))
        r.on_dispatch(rid, rk, "w0")
        r.on_finish(rid, **kwargs)
    assert r._state.learn.answer_tokens("m") == pytest.approx(50.0)


def test_imbalance_is_max_over_mean() -> None:
    assert imbalance([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert imbalance([3.0, 1.0, 0.0, 0.0]) == pytest.approx(3.0)
    assert imbalance([0.0, 0.0]) == 1.0


def test_router_exports_predicted_and_actual_ttft() -> None:
    clock = Clock()
    reg = CollectorRegistry()
    r = Router(RouterConfig(), registry=reg, clock=clock)
    for n in ("w0", "w1"):
        r.add_worker(WorkerInfo(n, f"http://127.0.0.1:1/{n}", ("m",), block_size=4))
    rk = r.rank("m", list(range(1, 41)))
    assert reg.get_sample_value("sluice_router_decision_seconds_count") == 1
    r.on_dispatch("a", rk, rk.best.worker)
    w = {"worker": rk.best.worker}
    assert reg.get_sample_value("sluice_router_predicted_ttft_seconds_count", w) == 1
    predicted = reg.get_sample_value("sluice_router_predicted_ttft_seconds_sum", w)
    assert predicted == pytest.approx(rk.best.predicted_ttft_s)
    # Busy worker, idle worker: the imbalance read at scrape time is 2 (max 2x the mean of two).
    assert reg.get_sample_value("sluice_router_load_imbalance_ratio") == pytest.approx(2.0)
    clock.t += 0.5
    r.on_first_token("a")
    r.on_first_token("a")  # a second first token is not a second observation
    assert reg.get_sample_value("sluice_router_actual_ttft_seconds_count", w) == 1
    assert reg.get_sample_value("sluice_router_actual_ttft_seconds_sum", w) == pytest.approx(0.5)
    err = reg.get_sample_value("sluice_router_ttft_prediction_error_seconds_sum", w)
    assert err == pytest.approx(abs(predicted - 0.5))
    r.remove_worker(rk.best.worker)
    assert reg.get_sample_value("sluice_router_actual_ttft_seconds_count", w) is None


def test_learners_that_share_their_statistics_fit_what_one_learner_of_all_observations_fits() -> None:
    """The frontends of --frontends N (router.replicas.node_state): each adds the others' `export()`."""
    cfg = LearningConfig(fleet_memory=1_000_000, worker_memory=1_000_000)
    one, a, b = CostLearner(cfg), CostLearner(cfg), CostLearner(cfg)
    rng = random.Random(3)
    for i in range(200):
        f = TtftFeatures(running=rng.choice((0, 0, 2)), tokens=rng.randint(10, 2000), pairs=0)
        worker = ("w0", "w1")[i % 2]
        ttft = (1.5 if worker == "w1" else 1.0) * (0.01 + 0.002 * f.running + 2e-4 * f.tokens)
        for learner in (one, a if i % 3 else b):
            learner.observe_ttft(worker, f, ttft, 0.0)
            learner.observe_answer("m", 10 if i % 3 else 40)
    a.set_remote([b.export()])
    b.set_remote([a.export()])
    one.set_remote([])  # solves the fleet's fit now (a learner solves every 16 observations)
    for learner in (a, b):  # forgetting is per observation: a memory of 10⁶ leaves a 10⁻⁴ difference
        for name in ("latency_s", "running_s", "token_s"):
            assert getattr(learner.fleet, name) == pytest.approx(getattr(one.fleet, name), rel=1e-3)
        assert learner.speed("w1") == pytest.approx(one.speed("w1"), rel=1e-3)
        assert learner.answer_tokens("m") == pytest.approx(one.answer_tokens("m"), rel=1e-3)
    assert a.speed("w1") > 1.15 and a.answer_tokens("m") == pytest.approx(20.0, rel=0.01)
    fleet = a.fleet
    with pytest.raises(ValueError):
        a.set_remote([{**b.export(), "fleet": [[float("nan")] * 16, [0.0] * 4, 1.0]}])
    assert a.fleet == fleet  # a malformed part changes nothing
