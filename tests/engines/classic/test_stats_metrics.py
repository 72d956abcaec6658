"""Classic statistics as Prometheus sees them: failures by Triton's reasons (REJECTED, CANCELED,
BACKEND, OTHER) from a real repository manager, and the per-phase histograms."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engines.classic import InferError, ModelRepositoryManager
from engines.classic.limits import ClassicLimits
from engines.classic.stats import PHASE_BUCKETS_S, ModelStats
from gateway.kserve import metrics as kserve_metrics
from tests.engines.classic.scheduling.test_scheduler_faults import GATED_PY, RAISES_PY, _bounded, _model, _module, _x


def test_phase_histograms_bucket_by_upper_bound() -> None:
    stats = ModelStats("m", "1")
    for ns in (40_000, 50_000, 50_001, 2_000_000_000, 90_000_000_000):  # 40 µs, 50 µs (a bound), 2 s, 90 s
        stats.request_started()
        stats.request_done(True, ns, queue_ns=ns // 2)
    stats.execution(rows=4, requests=2, input_ns=1_000, infer_ns=3_000_000, output_ns=1_000)
    snap = stats.snapshot()
    request = snap.phases["request"]
    assert request.counts[0] == 2  # <= 50 µs, the bound itself included
    assert request.counts[1] == 1
    assert request.counts[PHASE_BUCKETS_S.index(2.5)] == 1
    assert request.counts[-1] == 1  # beyond 60 s: +Inf
    assert request.sum_ns == 40_000 + 50_000 + 50_001 + 2_000_000_000 + 90_000_000_000
    assert sum(snap.phases["queue"].counts) == 5
    infer = snap.phases["compute_infer"]  # each request of the batch waited for the whole batch
    assert sum(infer.counts) == 2 and infer.sum_ns == 6_000_000


@pytest.fixture()
async def manager(tmp_path: Path):
    _model(tmp_path, "gated", GATED_PY, "dynamic_batching { max_queue_delay_microseconds: 0 }")
    _model(tmp_path, "raises", RAISES_PY)
    m = ModelRepositoryManager(tmp_path, limits=ClassicLimits(max_queue_size=1))
    await m.start()
    yield m
    _module("gated").GATE.set()
    await m.stop()


async def test_failures_by_reason_and_histograms_on_metrics(manager: ModelRepositoryManager) -> None:
    gated = _module("gated")
    running = asyncio.create_task(manager.infer("gated", "", {"X": _x([0, 0])}))
    await _bounded(asyncio.to_thread(gated.STARTED.acquire, True, 30))
    queued = asyncio.create_task(manager.infer("gated", "", {"X": _x([1, 1])}))
    while manager.statistics("gated")[0].pending_count < 2:
        await asyncio.sleep(0.01)
    with pytest.raises(InferError):  # the queue holds one: refused by the scheduler
        await manager.infer("gated", "", {"X": _x([2, 2])})
    queued.cancel()  # its client went away while it waited
    await asyncio.gather(queued, return_exceptions=True)
    with pytest.raises(InferError):  # an input the config does not declare: refused before any queue
        await manager.infer("gated", "", {"NOPE": _x([3, 3])})
    gated.GATE.set()
    await _bounded(running)
    with pytest.raises(InferError):  # the model's execute raised
        await _bounded(manager.infer("raises", "", {"X": _x([1, 0])}))

    registry = CollectorRegistry()
    kserve_metrics.register(registry, manager)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    failures = {(s.labels["model"], s.labels["reason"]): s.value
                for s in families["nv_inference_request_failure"].samples}
    assert failures[("gated", "REJECTED")] == 1
    assert failures[("gated", "CANCELED")] == 1
    assert failures[("gated", "OTHER")] == 1
    assert failures[("gated", "BACKEND")] == 0
    assert failures[("raises", "BACKEND")] == 1
    assert {s.labels["version"] for s in families["nv_inference_request_failure"].samples} == {"1"}
    request = families["sluice_classic_request_duration_seconds"]
    assert request.type == "histogram" and request.documentation
    count = next(s.value for s in request.samples
                 if s.name.endswith("_count") and s.labels == {"model": "gated", "version": "1"})
    assert count == 4  # the success and the three failures
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        family = families[f"sluice_classic_{phase}_duration_seconds"]
        inf = next(s.value for s in family.samples if s.labels.get("le") == "+Inf" and s.labels["model"] == "gated")
        assert inf == 1, phase  # the one request that ran
