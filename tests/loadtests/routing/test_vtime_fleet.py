"""The virtual-time fleet (loadtests/routing/vtime): sim engines behind the real router, in virtual time.

Small fleets and few requests: what is checked is that the fleet is the router's and the sim's
own behaviour (deterministic, bounded by the infinite-cache oracle, KV events identical through
msgpack), and the baselines' rules, not any figure of the reports."""

from __future__ import annotations

from engines.sim.model import kv_events as sim_events
from loadtests.routing.vtime import workloads
from loadtests.routing.vtime.baselines import CacheAwareModel, longest_prefix
from loadtests.routing.vtime.fleet import FleetConfig, VirtualFleet, policy_chooser
from loadtests.routing.vtime.kv import to_router_batch
from loadtests.routing.vtime.sessions import Session, Turn, turns_of
from loadtests.routing.vtime.stats import summarize

PROFILE = "vllm-cpu-tiny-llama"


def _fleet(workers: int = 4) -> VirtualFleet:
    return VirtualFleet(FleetConfig(workers=workers, profile=PROFILE, max_model_len=4096))


def _chat(requests: int = 60) -> list[Session]:
    spec = workloads.Chat(system_prompts=2, system_tokens=512, user_tokens=(32, 64), mean_turns=3, think_s=0.5)
    return workloads.chat(workloads.Shape(rate=20.0, requests=requests, seed=3, answer_tokens=8), spec)


def test_runs_are_deterministic_and_bounded_by_the_oracle() -> None:
    a = _fleet().run(_chat(), policy_chooser("prefix"))
    b = _fleet().run(_chat(), policy_chooser("prefix"))
    assert [(r.request_id, r.worker, r.cached_tokens, r.first_token_s) for r in a.requests] == \
           [(r.request_id, r.worker, r.cached_tokens, r.first_token_s) for r in b.requests]
    s = summarize(a, 1.0)
    assert s["finished"] == s["requests"] > 20
    assert 0.0 < s["hit_rate"] <= s["upper_bound_hit_rate"]
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in a.requests)


def test_prefix_beats_round_robin_on_shared_prompts() -> None:
    prefix = summarize(_fleet().run(_chat(), policy_chooser("prefix")), 1.0)
    rr = summarize(_fleet().run(_chat(), policy_chooser("round_robin")), 1.0)
    assert prefix["hit_rate"] > rr["hit_rate"]


def _shared_head(n: int) -> list[Session]:
    """Every prompt starts with the same 4 blocks, then its own 8 (a trace's shape), arriving
    faster than one worker serves them."""
    head = workloads.tokens("head", 512)
    return [Session(f"s{i}", i * 0.005, turns_of([Turn(head + workloads.tokens(f"own{i}", 1024), 4)]))
            for i in range(n)]


def test_a_shared_head_does_not_pile_onto_one_worker() -> None:
    greedy = _fleet().run(_shared_head(40), longest_prefix)
    assert len({r.worker for r in greedy.requests[1:]}) == 1  # the baseline's failure, reproduced
    ours = _fleet().run(_shared_head(40), policy_chooser("prefix"))
    assert len({r.worker for r in ours.requests}) == 4


def test_kv_events_are_the_same_through_msgpack() -> None:
    stored = sim_events.BlockStored((11, 12), None, tuple(range(8)), 4, None)
    removed = sim_events.BlockRemoved((11,))
    for events in ([stored], [stored, removed], [sim_events.AllBlocksCleared()]):
        assert to_router_batch(5.0, events, wire=True) == to_router_batch(5.0, events, wire=False)


def test_cache_aware_model_rules() -> None:
    m = CacheAwareModel()  # vllm-router 0.1.17's defaults: 0.3 match threshold, 64 / 1.5 balance
    names = ["a", "b", "c"]
    chain = [1, 2, 3, 4]
    m.trees = {"a": {1, 2, 3}, "b": {1}, "c": set()}
    # Balanced: the longest match wins when it covers more than 0.3 of the prompt (2 of 4 blocks of 16).
    assert m.choose(names, {"a": 5, "b": 0, "c": 0}, chain, 64) == "a"
    m.trees["a"] = {1, 2}
    assert m.choose(names, {}, chain, 64) == "a"
    # Below the threshold (1 of 4): the smallest tree.
    assert m.choose(names, {}, [1, 9, 9, 9], 64) == "c"
    # Imbalanced (max - min > 64 and max > 1.5 x min): the least loaded, whatever the cache.
    assert m.choose(names, {"a": 80, "b": 3, "c": 7}, chain, 64) == "b"
    # Not imbalanced by the absolute threshold (60 - 3 <= 64): the cache decides.
    assert m.choose(names, {"a": 60, "b": 3, "c": 7}, chain, 64) == "a"
