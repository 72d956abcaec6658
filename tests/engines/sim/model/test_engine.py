"""The sim's pure core driven in virtual time: prefix hits, chunked prefill, the batch
bound, preemption, step times from the cost model, seeded outputs, KV events."""

from __future__ import annotations

import pytest

from engines.sim.model.config import CostModel, SimConfig, StepWork
from engines.sim.model.engine import RequestSpec, SimEngine
from engines.sim.model.kv_events import BlockRemoved, BlockStored, encode_batch
from engines.sim.model.outputs import StepResult
from router.index.events import BlockStored as WireStored
from router.index.events import decode_vllm_batch

B = 16  # a small block size keeps the prompts short


def engine(**kw: object) -> SimEngine:
    base: dict[str, object] = {"vocab_size": 1000, "max_model_len": 256, "block_size": B, "num_gpu_blocks": 64,
                               "max_num_seqs": 8, "max_num_batched_tokens": 512}
    return SimEngine(SimConfig(**(base | kw)))  # type: ignore[arg-type]


def spec(rid: str, prompt: list[int], max_tokens: int = 4, seed: int = 1, **kw: object) -> RequestSpec:
    return RequestSpec(rid, prompt, max_tokens, seed, **kw)  # type: ignore[arg-type]


def run(eng: SimEngine, now: float = 0.0, limit: int = 10_000) -> list[StepResult]:
    """Step until idle, each step starting when the previous one ended (a one-engine event loop)."""
    steps = []
    t = eng.next_event_time()
    while t is not None and len(steps) < limit:
        steps.append(eng.step(max(t, now)))
        t = eng.next_event_time()
    return steps


def outputs(steps: list[StepResult], rid: str) -> list[int]:
    return [t for s in steps for o in s.outputs if o.request_id == rid for t in o.new_token_ids]


def final(steps: list[StepResult], rid: str):  # type: ignore[no-untyped-def]
    return next(o for s in steps for o in s.outputs if o.request_id == rid and o.finish_reason)


def test_a_repeated_prompt_hits_its_whole_blocks() -> None:
    eng = engine()
    prompt = list(range(100, 100 + 2 * B + 5))
    eng.add_request(spec("a", prompt), 0.0)
    first = final(run(eng), "a")
    eng.add_request(spec("b", prompt), 0.0)
    steps = run(eng)
    assert (first.cached_tokens, final(steps, "b").cached_tokens) == (0, 2 * B)
    assert steps[0].prefill_tokens == 5  # only the uncached tail is prefilled


def test_the_last_prompt_token_is_always_recomputed() -> None:
    eng = engine()
    prompt = list(range(300, 300 + 2 * B))  # exactly two blocks
    eng.add_request(spec("a", prompt), 0.0)
    run(eng)
    eng.add_request(spec("b", prompt), 0.0)
    steps = run(eng)
    assert final(steps, "b").cached_tokens == B and steps[0].prefill_tokens == B


def test_a_different_cache_salt_never_hits() -> None:
    eng = engine()
    prompt = list(range(2 * B + 1))
    eng.add_request(spec("a", prompt, cache_salt="alice"), 0.0)
    run(eng)
    eng.add_request(spec("b", prompt, cache_salt="bob"), 0.0)
    eng.add_request(spec("c", prompt, cache_salt="alice"), 10.0)
    steps = run(eng)
    assert (final(steps, "b").cached_tokens, final(steps, "c").cached_tokens) == (0, 2 * B)


def test_chunked_prefill_respects_the_token_budget() -> None:
    eng = engine(max_num_batched_tokens=32)
    eng.add_request(spec("short", [1, 2, 3], max_tokens=20), 0.0)
    first = eng.step(0.0)
    assert first.prefill_tokens == 3 and len(first.outputs) == 1
    eng.add_request(spec("long", list(range(500, 600))), 0.0)  # 100 tokens: four chunks
    steps = run(eng)
    chunks = [s.prefill_tokens for s in steps if s.prefill_tokens]
    assert chunks == [31, 31, 31, 7]  # "short" decodes alongside, taking 1 token of each step
    assert all(s.prefill_tokens + s.decode_seqs <= 32 for s in steps)
    first_long = next(i for i, s in enumerate(steps) if any(o.request_id == "long" for o in s.outputs))
    assert first_long == 3  # no token before its last chunk


def test_the_batch_is_bounded_by_max_num_seqs() -> None:
    eng = engine(max_num_seqs=2)
    for i in range(3):
        eng.add_request(spec(f"r{i}", [10 + i] * 5, max_tokens=3), 0.0)
    steps = run(eng)
    assert max(len(s.outputs) for s in steps) == 2
    assert eng.counters.max_batch == 2
    r2_first = next(i for i, s in enumerate(steps) if any(o.request_id == "r2" for o in s.outputs))
    r0_done = next(i for i, s in enumerate(steps) for o in s.outputs if o.request_id == "r0" and o.finish_reason)
    assert r2_first > r0_done  # it waited for a slot


def test_step_time_comes_from_the_cost_model() -> None:
    cost = CostModel(base_s=0.01, prefill_token_s=0.001, prefill_attn_s=1e-6, decode_seq_s=0.002)
    eng = engine(cost=cost)
    eng.add_request(spec("a", list(range(40)), max_tokens=3), 0.0)
    prefill = eng.step(0.0)
    pairs = 40 * 41 // 2
    assert prefill.duration_s == pytest.approx(0.01 + 0.001 * 40 + 1e-6 * pairs)
    eng.add_request(spec("b", list(range(50, 60)), max_tokens=3), prefill.end_s)
    mixed = eng.step(prefill.end_s)  # a decodes, b prefills 10 tokens
    assert (mixed.decode_seqs, mixed.prefill_tokens) == (1, 10)
    assert mixed.duration_s == pytest.approx(0.01 + 0.001 * 10 + 1e-6 * 55 + 0.002)
    assert mixed.start_s == prefill.end_s
    assert cost.step_s(StepWork()) == 0.0  # an idle step costs nothing


def test_ttft_is_counted_in_virtual_time_from_arrival() -> None:
    eng = engine(cost=CostModel(base_s=0.5, decode_seq_s=0.25))
    eng.add_request(spec("a", [1, 2, 3], max_tokens=2), 0.0)
    step = eng.step(0.0)  # runs until 0.5
    eng.add_request(spec("b", [4, 5, 6], max_tokens=1), 0.2)  # arrives mid-step: next step
    steps = [step, *run(eng)]
    ttft = {o.request_id: o.ttft_s for s in steps for o in s.outputs if o.ttft_s is not None}
    assert ttft == {"a": pytest.approx(0.5), "b": pytest.approx(0.5 + 0.75 - 0.2)}
    assert eng.next_event_time() is None


def test_outputs_are_a_function_of_the_seed_only() -> None:
    alone = engine()
    alone.add_request(spec("x", [7] * 20, max_tokens=12, seed=42), 0.0)
    solo = outputs(run(alone), "x")
    crowded = engine(max_num_batched_tokens=8)
    for i in range(5):
        crowded.add_request(spec(f"n{i}", [i] * 30, max_tokens=12, seed=i), 0.0)
    crowded.add_request(spec("x", [7] * 20, max_tokens=12, seed=42), 0.0)
    assert outputs(run(crowded), "x") == solo and len(solo) == 12
    other = engine()
    other.add_request(spec("x", [7] * 20, max_tokens=12, seed=43), 0.0)
    assert outputs(run(other), "x") != solo


def test_outputs_stay_in_the_vocabulary_and_avoid_special_tokens() -> None:
    eng = engine(vocab_size=50, special_token_ids=frozenset({0, 1, 2}), eos_token_id=2)
    eng.add_request(spec("a", [5] * 4, max_tokens=200, seed=3), 0.0)
    out = outputs(run(eng), "a")
    assert len(out) == 200 and all(3 <= t < 50 for t in out)


def test_eos_only_with_a_probability_and_never_with_ignore_eos() -> None:
    eng = engine(eos_token_id=2, eos_prob=1.0, special_token_ids=frozenset({2}))
    eng.add_request(spec("stops", [5] * 4, max_tokens=10), 0.0)
    eng.add_request(spec("ignores", [6] * 4, max_tokens=10, ignore_eos=True), 0.0)
    steps = run(eng)
    assert (final(steps, "stops").finish_reason, final(steps, "stops").completion_tokens) == ("stop", 1)
    assert (final(steps, "ignores").finish_reason, final(steps, "ignores").completion_tokens) == ("length", 10)


def test_generation_stops_at_max_model_len() -> None:
    eng = engine(max_model_len=32, num_gpu_blocks=4)
    eng.add_request(spec("a", [1] * 30, max_tokens=100), 0.0)
    done = final(run(eng), "a")
    assert (done.finish_reason, done.completion_tokens) == ("length", 2)


def test_preemption_when_blocks_run_out_and_the_preempted_request_finishes_the_same() -> None:
    eng = engine(num_gpu_blocks=4, max_model_len=64)  # 4 blocks of 16: two requests cannot both grow
    eng.add_request(spec("a", [1] * 20, max_tokens=30, seed=5), 0.0)
    eng.add_request(spec("b", [2] * 20, max_tokens=30, seed=6), 0.0)
    steps = run(eng)
    assert any(s.preempted for s in steps) and eng.counters.num_preemptions >= 1
    assert final(steps, "a").completion_tokens == final(steps, "b").completion_tokens == 30
    solo = engine(num_gpu_blocks=4, max_model_len=64)
    solo.add_request(spec("b", [2] * 20, max_tokens=30, seed=6), 0.0)
    assert outputs(steps, "b") == outputs(run(solo), "b")
    assert eng.cache.num_free == 4  # everything released at the end


def test_abort_frees_the_blocks() -> None:
    eng = engine()
    eng.add_request(spec("a", list(range(3 * B)), max_tokens=50), 0.0)
    eng.step(0.0)
    assert eng.snapshot().running == 1 and eng.cache.num_free < 64
    assert eng.abort("a") and not eng.abort("a")
    assert eng.snapshot().running == 0 and eng.cache.num_free == 64
    assert eng.next_event_time() is None


def test_kv_events_chain_blocks_and_announce_evictions() -> None:
    eng = engine(num_gpu_blocks=4, max_model_len=64)
    first = list(range(10, 10 + 2 * B + 3))
    eng.add_request(spec("a", first, max_tokens=1), 0.0)
    events = [e for s in run(eng) for e in s.kv_events]
    assert len(events) == 1 and isinstance(events[0], BlockStored)
    stored = events[0]
    assert stored.parent_block_hash is None and len(stored.block_hashes) == 2
    assert stored.token_ids == tuple(first[: 2 * B])
    eng.add_request(spec("b", list(range(500, 500 + 3 * B + 1)), max_tokens=1), 0.0)  # needs all 4 blocks
    events = [e for s in run(eng) for e in s.kv_events]
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored.block_hashes)


def test_decoded_tokens_fill_blocks_that_are_announced_with_their_parent() -> None:
    eng = engine()
    eng.add_request(spec("a", list(range(B + 4)), max_tokens=B), 0.0)
    steps = run(eng)
    stored = [e for s in steps for e in s.kv_events if isinstance(e, BlockStored)]
    assert [len(e.block_hashes) for e in stored] == [1, 1]
    assert stored[1].parent_block_hash == stored[0].block_hashes[0]
    assert stored[1].token_ids[:4] == tuple(range(B, B + 4))
    assert list(stored[1].token_ids[4:]) == outputs(steps, "a")[: B - 4]


def test_the_wire_form_is_what_the_router_decodes_from_vllm() -> None:
    ev = BlockStored((11, 12), None, tuple(range(2 * B)), B, cache_salt="s")
    batch = decode_vllm_batch(encode_batch(123.5, [ev, BlockRemoved((9,))]))
    assert batch.ts == 123.5 and batch.dp_rank == 0
    wire = batch.events[0]
    assert isinstance(wire, WireStored)
    assert (wire.block_hashes, wire.token_ids, wire.block_size, wire.medium) == ((11, 12), ev.token_ids, B, "GPU")
    assert wire.extra_keys == (("s",), None)


def test_bad_requests_are_refused() -> None:
    eng = engine()
    with pytest.raises(ValueError, match="empty"):
        eng.add_request(spec("a", []), 0.0)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request(spec("a", [1] * 256), 0.0)
    eng.add_request(spec("a", [1]), 0.0)
    with pytest.raises(ValueError, match="already"):
        eng.add_request(spec("a", [1]), 0.0)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="cannot hold one request"):
        SimConfig(vocab_size=10, max_model_len=2048, block_size=128, num_gpu_blocks=8)
    with pytest.raises(ValueError, match="eos_token_id"):
        SimConfig(vocab_size=10, eos_prob=0.1)
    with pytest.raises(ValueError, match="decode_seq_s"):
        CostModel(decode_seq_s=-1.0)


def test_request_latency_delays_scheduling_without_occupying_the_engine() -> None:
    eng = engine(cost=CostModel(base_s=0.1, decode_seq_s=0.0, request_latency_s=0.3))
    eng.add_request(spec("a", [1, 2, 3], max_tokens=3), 0.0)
    assert eng.next_event_time() == pytest.approx(0.3)  # due once it is through the latency
    assert eng.step(0.1).idle  # too early: nothing is ready
    first = eng.step(0.3)
    assert first.start_s == pytest.approx(0.3) and first.outputs[0].ttft_s == pytest.approx(0.4)
    eng.add_request(spec("b", [4, 5, 6], max_tokens=1), 0.35)  # arrives while a decodes
    steps = [first, *run(eng)]
    b_first = next(s for s in steps if any(o.request_id == "b" for o in s.outputs))
    assert b_first.start_s >= 0.35 + 0.3 - 1e-9  # a's decode steps went on meanwhile
    assert [o.ttft_s for o in b_first.outputs if o.request_id == "b"] == [pytest.approx(b_first.end_s - 0.35)]


def test_a_discrete_event_loop_drives_many_engines_in_virtual_time() -> None:
    """The documented driving API (docs/sim.md): arrivals and step ends on one heap, no clock, no sockets."""
    import heapq

    cost = CostModel(base_s=0.002, prefill_token_s=1e-5, decode_seq_s=1e-4, request_latency_s=0.01)
    engines = [engine(cost=cost) for _ in range(4)]
    events: list[tuple[float, int, str, int]] = []  # (time, tie-break, kind, engine index)
    for i in range(40):  # 40 requests, 10 per engine, 5 ms apart
        heapq.heappush(events, (0.005 * i, i, "arrive", i % 4))
    pending = dict.fromkeys(range(4), 0)
    ttft: dict[str, float] = {}
    busy = [False] * 4
    seq = 1000
    while events:
        t, _, kind, e = heapq.heappop(events)
        eng = engines[e]
        if kind == "arrive":
            eng.add_request(spec(f"e{e}-{pending[e]}", [e + 1] * 40, max_tokens=5, seed=pending[e]), t)
            pending[e] += 1
        else:
            result = eng.step(t)
            ttft.update({o.request_id: o.ttft_s for o in result.outputs if o.ttft_s is not None})
            busy[e] = False
        due = eng.next_event_time()
        if due is not None and not busy[e]:
            busy[e] = True
            seq += 1
            # A step starts when due; its results exist at its end, when the next one may start.
            heapq.heappush(events, (max(due, t), seq, "step", e))
    assert len(ttft) == 40 and all(eng.next_event_time() is None for eng in engines)
    assert ttft["e0-0"] == pytest.approx(0.01 + 0.002 + 40 * 1e-5)  # latency + one prefill step
    assert ttft["e0-1"] == pytest.approx(0.01 + 0.002 + 8 * 1e-5)  # the same prompt: 2 blocks cached
