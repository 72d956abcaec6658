"""The sim's KV events drive the real router without sockets (how a virtual-time simulation feeds it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from engines.sim.model.config import SimConfig
from engines.sim.model.engine import RequestSpec, SimEngine
from engines.sim.model.kv_events import encode_batch
from router import Router, RouterConfig, WorkerInfo
from router.index.events import decode_vllm_batch

B = 16
MODEL = "m"


def _drain(engine: SimEngine, router: Router, worker: str) -> None:
    t = engine.next_event_time()
    while t is not None:
        result = engine.step(t)
        if result.kv_events:
            router.feed.apply_kv_batch(worker, decode_vllm_batch(encode_batch(result.end_s, result.kv_events)))
        t = engine.next_event_time()


def test_the_router_predicts_what_the_sim_reports_and_forgets_what_it_evicts() -> None:
    engine = SimEngine(SimConfig(vocab_size=500, max_model_len=96, block_size=B, num_gpu_blocks=6))
    router = Router(RouterConfig(default_block_size=B), registry=CollectorRegistry())
    router.add_worker(WorkerInfo("w", "http://127.0.0.1:1", (MODEL,), block_size=B,
                                 kv_events_endpoint="tcp://127.0.0.1:1"))
    prompt = list(range(100, 100 + 3 * B + 2))
    engine.add_request(RequestSpec("a", prompt, max_tokens=1, seed=1), 0.0)
    _drain(engine, router, "w")
    assert router.rank(MODEL, prompt).best.predicted_cached_tokens == 3 * B

    other = list(range(300, 300 + 5 * B + 1))  # needs 6 blocks: evicts the first prompt's
    engine.add_request(RequestSpec("b", other, max_tokens=1, seed=2), 1.0)
    _drain(engine, router, "w")
    assert router.rank(MODEL, prompt).best.predicted_cached_tokens == 0
    engine.add_request(RequestSpec("c", other, max_tokens=1, seed=3), 2.0)
    t = engine.next_event_time()
    assert t is not None
    reported = engine.step(t).outputs[0].cached_tokens
    assert router.rank(MODEL, other).best.predicted_cached_tokens == reported == 5 * B
