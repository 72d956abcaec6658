"""WorkerPool.refresh_capacity: a routed model's admission limits and its capacity gauge follow
its workers as they come, go, turn unhealthy and drain. A real `router.Router`, never started, and
a real metrics registry; the workers are fake engines (no network)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from engines.launchers.registration import WorkerRecord
from gateway.llm.admission import AdmissionConfig
from gateway.llm.metrics import LLMMetrics
from gateway.llm.registry import ModelRegistry
from gateway.llm.workers.pool import RoutedBackend, WorkerPool
from gateway.llm.workers.probe import engine_capacity
from router import Router, RouterConfig, WorkerInfo
from tests.gateway.llm.fakes import FakeEngine, FakeTokenizer


def _add(pool: WorkerPool, name: str, capacity: int | None) -> None:
    pool.engines[name] = FakeEngine(name)  # type: ignore[assignment]
    pool.capacities[name] = capacity
    pool.router.add_worker(WorkerInfo(name, "http://127.0.0.1:9", ("m",), block_size=4))


async def test_admission_follows_the_fleet() -> None:
    registry = CollectorRegistry()
    metrics = LLMMetrics(registry)
    models = ModelRegistry(AdmissionConfig())
    models.on_change, models.on_limits = metrics.model_changed, metrics.limits_changed
    router = Router(RouterConfig(), clock=lambda: 1000.0)
    pool = WorkerPool(models, router, None)
    models.add("m", FakeTokenizer(), 4096, RoutedBackend("m", pool))  # type: ignore[arg-type]
    admission = models.models["m"].admission

    def gauge() -> float | None:
        return registry.get_sample_value("sluice_model_capacity", {"model": "m"})

    try:
        for i in range(4):
            _add(pool, f"w{i}", 128)
        pool.refresh_capacity()
        assert (admission.capacity, admission.max_running, admission.max_queued) == (512, 512, 512)
        assert gauge() == 512
        assert registry.get_sample_value("sluice_requests_inflight_limit", {"model": "m"}) == 512
        _add(pool, "w4", None)  # says nothing of its batch: the stated default
        pool.refresh_capacity()
        assert admission.max_running == 512 + 256
        router._state.workers["w0"].health.healthy = False  # the router's health check failed
        router.drain("w1")
        pool.refresh_capacity()
        assert admission.max_running == 256 + 256 and gauge() == 512
        router._state.workers["w0"].health.healthy = True
        router.remove_worker("w4")
        pool.refresh_capacity()
        assert admission.max_running == 3 * 128 and gauge() == 3 * 128  # w0 back, w1 draining, w4 gone
    finally:
        await pool.stop()


async def test_a_workers_capacity_comes_from_its_record_else_its_model_card() -> None:
    record = WorkerRecord(name="w", url="http://127.0.0.1:9", engine="sim")
    assert await engine_capacity(record.model_copy(update={"capacity": 48}), {"m": {"max_num_seqs": 7}}) == 48
    assert await engine_capacity(record, {"m": {"id": "m", "max_num_seqs": 7}}) == 7  # the sim's card
    assert await engine_capacity(record, {"m": {"id": "m", "max_num_seqs": True}}) is None
    assert await engine_capacity(record.model_copy(update={"engine": "openai"}), {"m": {"id": "m"}}) is None
