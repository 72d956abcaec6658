from __future__ import annotations

import pytest

from router.config import TtftModel
from router.cost import KvPressure
from router.policies import WorkerView, rank
from router.telemetry.load import LoadSnapshot

# 1 ms per prefill token, nothing else: costs read as milliseconds of prefill.
MS = TtftModel(latency_s=0.0, running_s=0.0, token_s=1e-3, pair_s=0.0)


def view(name, cached=0, available=True, model=MS, kv=None, **load):
    return WorkerView(name, cached, LoadSnapshot(**load), available, model, kv)


def names(cands):
    return [c.worker for c in cands]


def test_prefix_prefers_cached_worker_in_seconds():
    out = rank("prefix", [view("a"), view("b", cached=512)], prompt_tokens=600, tie_key=1)
    assert names(out) == ["b", "a"]
    assert out[0].reason == "prefix_hit" and out[0].predicted_cached_tokens == 512
    assert out[0].cost == pytest.approx(0.088) and out[1].cost == pytest.approx(0.600)
    assert out[0].predicted_ttft_s == pytest.approx(0.088)
    assert out[1].reason == "load"


def test_a_tie_never_goes_to_a_worker_whose_batch_is_full():
    # Equal cost (the fit sees no load effect); a was sent less work so far, but runs its whole batch.
    full = WorkerView("a", 0, LoadSnapshot(in_flight=8), True, MS, None, max_num_seqs=8)
    room = WorkerView("b", 0, LoadSnapshot(in_flight=7, assigned_prefill_tokens=10_000), True, MS, None,
                      max_num_seqs=8)
    for policy in ("prefix", "least_load"):
        assert names(rank(policy, [full, room], prompt_tokens=100, tie_key=1, tolerance=0.1)) == ["b", "a"], policy
    unknown = WorkerView("a", 0, LoadSnapshot(in_flight=8), True, MS, None)  # no bound known: no such rule
    assert names(rank("prefix", [unknown, room], prompt_tokens=100, tie_key=1, tolerance=0.1)) == ["a", "b"]
    # Beyond the tie, cost still rules: a full worker holding most of the prompt is still cheaper.
    hit = WorkerView("a", 0 + 900, LoadSnapshot(in_flight=8), True, MS, None, max_num_seqs=8)
    assert names(rank("prefix", [hit, room], prompt_tokens=1000, tie_key=1, tolerance=0.1))[0] == "a"


def test_a_queue_longer_than_the_prefix_it_saves_sends_the_request_elsewhere():
    # b saves 512 tokens of prefill; it wins while less than 512 tokens queue ahead of it there.
    for queued, winner in ((511, "b"), (513, "a")):
        out = rank("prefix", [view("a"), view("b", cached=512, queued_prefill_tokens=queued)],
                   prompt_tokens=600, tie_key=1)
        assert out[0].worker == winner, queued
    assert out[0].reason == "load"


def test_the_running_batch_slows_the_steps_a_new_request_waits_through():
    model = TtftModel(latency_s=0.03, running_s=0.003, token_s=1e-3, pair_s=0.0)
    idle, busy = view("a", model=model), view("b", model=model, in_flight=40)
    out = rank("prefix", [busy, idle], prompt_tokens=100, tie_key=1)
    assert out[0].predicted_ttft_s == pytest.approx(0.03 + 0.1)
    assert out[1].predicted_ttft_s == pytest.approx(0.03 + 0.003 * 40 + 0.1)
    assert names(out) == ["a", "b"]
    # ... and a busy worker that holds the prompt still wins while its batch, and the delay its
    # remaining prefill adds to that batch, cost less than the prefill it saves.
    for running, winner in ((5, "b"), (8, "a")):
        out = rank("prefix", [view("a", model=model), view("b", cached=90, model=model, in_flight=running)],
                   prompt_tokens=100, tie_key=1)
        assert out[0].worker == winner, running
        by = {c.worker: c for c in out}
        assert by["b"].cost == pytest.approx(0.03 + 0.003 * running + 0.010 + running * 0.010)
    assert by["b"].reason == "prefix_hit"


def test_attention_makes_a_long_uncached_prompt_cost_more_than_its_tokens():
    model = TtftModel(running_s=0.0, token_s=1e-5, pair_s=1e-8)
    out = rank("prefix", [view("cold", model=model), view("warm", cached=3968, model=model)], prompt_tokens=4000,
               tie_key=1)
    cold, warm = out[1], out[0]
    assert warm.worker == "warm"
    assert cold.predicted_ttft_s == pytest.approx(4000 * 1e-5 + (4000 * 4001 // 2) * 1e-8)
    assert warm.predicted_ttft_s == pytest.approx(32 * 1e-5 + (32 * 3968 + 32 * 33 // 2) * 1e-8)
    # The queue's attention counts too.
    loaded = rank("prefix", [view("a", model=model, queued_prefill_pairs=10**9)], prompt_tokens=1, tie_key=1)
    assert loaded[0].predicted_ttft_s == pytest.approx(1e-5 + (10**9 + 1) * 1e-8)


def test_a_slower_worker_loses_at_equal_cache():
    slow = TtftModel(running_s=0.0, token_s=2e-3)
    out = rank("prefix", [view("slow", cached=128, model=slow), view("fast", cached=128)], prompt_tokens=600,
               tie_key=1)
    assert names(out) == ["fast", "slow"]


def test_evicting_blocks_that_come_back_costs_their_refill():
    # 600 uncached tokens need 5 blocks of 128; with 2 free, 3 evict, and half of evictions are refilled.
    tight = KvPressure(free_blocks=2, refill_ratio=0.5, block_size=128)
    out = rank("prefix", [view("a", kv=tight)], prompt_tokens=600, tie_key=1)
    assert out[0].predicted_ttft_s == pytest.approx(0.6)
    assert out[0].cost == pytest.approx(0.6 + 3 * 0.5 * 128 * 1e-3)
    roomy = KvPressure(free_blocks=5, refill_ratio=0.5, block_size=128)
    never_back = KvPressure(free_blocks=0, refill_ratio=0.0, block_size=128)
    for kv in (roomy, never_back):
        assert rank("prefix", [view("a", kv=kv)], prompt_tokens=600, tie_key=1)[0].cost == pytest.approx(0.6)
    # So under pressure the cached worker keeps the request against a longer queue than its prefix.
    out = rank("prefix", [view("a", kv=tight), view("b", cached=512, queued_prefill_tokens=600, kv=tight)],
               prompt_tokens=600, tie_key=1)
    assert out[0].worker == "b"


def test_prefix_ties_spread_by_prompt_key():
    firsts = {rank("prefix", [view("a"), view("b"), view("c")], prompt_tokens=10, tie_key=k)[0].worker
              for k in range(60)}
    assert firsts == {"a", "b", "c"}
    out = rank("prefix", [view("a"), view("b")], prompt_tokens=10, tie_key=7)
    assert out[0].reason == "no_prefix"


def test_unavailable_workers_rank_last_as_degraded():
    out = rank("prefix", [view("a", cached=900, available=False), view("b")], prompt_tokens=1000, tie_key=3)
    assert names(out) == ["b", "a"] and out[1].reason == "degraded"


def test_the_running_batch_is_the_larger_of_tracked_and_scraped():
    model = TtftModel(running_s=0.01, token_s=0.0)
    out = rank("prefix", [view("a", model=model, in_flight=1, running=3, waiting=2)], prompt_tokens=1, tie_key=1)
    assert out[0].predicted_ttft_s == pytest.approx(5 * 0.01)


def test_least_load_ignores_cache():
    out = rank("least_load", [view("a", cached=1000, in_flight=2, queued_prefill_tokens=200),
                              view("b", in_flight=1, queued_prefill_tokens=100)], prompt_tokens=1100, tie_key=1)
    assert names(out) == ["b", "a"] and out[0].reason == "least_load"
    assert out[1].predicted_cached_tokens == 1000  # still reported, for the closed loop
    assert out[1].predicted_ttft_s == pytest.approx(0.3)  # its real prediction does count the cache


def test_round_robin_rotates():
    vs = [view("c"), view("a"), view("b")]
    firsts = [rank("round_robin", vs, prompt_tokens=1, tie_key=0, turn=t)[0].worker for t in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_session_is_consistent_and_falls_back_without_key():
    vs = [view("a"), view("b"), view("c")]
    one = rank("session", vs, prompt_tokens=1, tie_key=0, session_key="user-1")
    again = rank("session", list(reversed(vs)), prompt_tokens=1, tie_key=99, session_key="user-1")
    assert names(one) == names(again) and one[0].reason == "session"
    # Removing a worker that is not the session's first choice keeps the choice.
    others = [v for v in vs if v.name != one[-1].worker]
    assert rank("session", others, prompt_tokens=1, tie_key=0, session_key="user-1")[0].worker == one[0].worker
    firsts = {rank("session", vs, prompt_tokens=1, tie_key=0, session_key=f"s{i}")[0].worker for i in range(60)}
    assert firsts == {"a", "b", "c"}
    fb = rank("session", [view("a"), view("b", cached=256)], prompt_tokens=300, tie_key=0)
    assert fb[0].worker == "b" and fb[0].reason == "session_no_key"


def test_unknown_policy():
    with pytest.raises(ValueError):
        rank("random", [view("a")], prompt_tokens=1, tie_key=0)


def test_an_answer_that_would_share_a_busy_batch_is_priced_into_prefix_but_not_into_its_ttft():
    # b holds 90 of the prompt's 100 tokens (saves 90 ms of prefill) but runs 2 requests, each of which
    # makes a step 3 ms longer: the first token waits through one such step, an answer of A tokens A
    # of them; and the 10 ms left of its prefill hold up both of the running requests.
    model = TtftModel(latency_s=0.03, running_s=0.003, token_s=1e-3, pair_s=0.0)
    workers = [view("a", model=model), view("b", cached=90, model=model, in_flight=2)]
    for answer, winner in ((0.0, "b"), (10.0, "b"), (11.0, "a"), (64.0, "a")):
        out = rank("prefix", workers, prompt_tokens=100, tie_key=1, answer_tokens=answer)
        assert out[0].worker == winner, answer
        by = {c.worker: c for c in out}
        assert by["b"].cost == pytest.approx(0.03 + 0.003 * 2 + 0.010 + 0.003 * 2 * answer + 2 * 0.010)
        assert by["b"].predicted_ttft_s == pytest.approx(0.03 + 0.003 * 2 + 0.010)  # TTFT unchanged
        assert by["a"].cost == pytest.approx(0.03 + 0.1)  # idle: nothing to delay, no batch to share
    # These terms are the prefix policy's: least_load still prices the TTFT alone.
    out = rank("least_load", workers, prompt_tokens=100, tie_key=1, answer_tokens=64.0)
    assert {c.worker: c.cost for c in out}["b"] == pytest.approx(0.03 + 0.003 * 2 + 0.1)


def test_with_nothing_worth_caching_anywhere_prefix_ranks_as_least_load():
    # With 2 requests decoding on one worker and a prefill queued on the other, the decode and
    # delay terms price the decoding worker higher (0.834 s against 0.817 s), while its TTFT is
    # lower (0.602 s against 0.701 s). With no worker holding the prompt, prefix must rank as
    # least_load does: those terms weigh a hit against the batch it joins, and there is none.
    model = TtftModel(latency_s=0.5, running_s=1e-3, token_s=1e-3, pair_s=0.0)
    decoding = view("decoding", model=model, in_flight=2)
    queued = view("queued", model=model, in_flight=1, queued_prefill_tokens=100)
    least = rank("least_load", [queued, decoding], prompt_tokens=100, tie_key=1)
    assert names(least) == ["decoding", "queued"]
    out = rank("prefix", [queued, decoding], prompt_tokens=100, tie_key=1, answer_tokens=16.0)
    assert names(out) == names(least) and {c.reason for c in out} == {"no_prefix"}
    assert [c.cost for c in out] == pytest.approx([0.602, 0.701])
    # A hit within the cost's error (8 of 100 tokens, tolerance 10 %) is no hit either ...
    held = view("decoding", cached=8, model=model, in_flight=2)
    out = rank("prefix", [queued, held], prompt_tokens=100, tie_key=1, tolerance=0.1, answer_tokens=16.0)
    assert names(out) == ["decoding", "queued"] and out[0].reason == "no_prefix"
    # ... while one beyond it is priced with every term.
    held = view("queued", cached=16, model=model, in_flight=1, queued_prefill_tokens=100)
    out = rank("prefix", [held, decoding], prompt_tokens=100, tie_key=1, tolerance=0.1, answer_tokens=16.0)
    assert out[0].worker == "queued" and out[0].reason == "prefix_hit"
    assert out[0].cost == pytest.approx(0.5 + 0.001 + 0.184 + 0.016 + 0.084)
    # However large the model's error (0.95 on a starved machine), more than half the prompt held
    # is a hit worth keeping; less is within the error.
    for cached, reason in ((60, "prefix_hit"), (40, "no_prefix")):
        held = view("queued", cached=cached, model=model, in_flight=1)
        out = rank("prefix", [held, decoding], prompt_tokens=100, tie_key=1, tolerance=0.95, answer_tokens=16.0)
        assert {c.reason for c in out} <= {reason, "load"} and out[0].reason == reason, (cached, out)


def test_among_ties_a_worker_with_a_prefill_queued_comes_last():
    # A model whose error is large (tolerance 0.9) calls all three a tie; each was sent the same
    # prefill so far. A request sent where a prefill is queued waits for it, so that worker must
    # come last whatever the prompt. For prefix the idle and the decoding one are a tie (spread by
    # the hash); least_load takes the one running fewer requests (a count the frontends share, where
    # work sent so far is each one's own: two frontends would otherwise pile onto each other's).
    model = TtftModel(latency_s=1.0, running_s=1e-3, token_s=1e-4, pair_s=0.0)
    workers = [view("queued", model=model, in_flight=1, queued_prefill_tokens=1000, assigned_prefill_tokens=1000),
               view("decoding", model=model, in_flight=1, assigned_prefill_tokens=1000),
               view("idle", model=model, assigned_prefill_tokens=1000)]
    for policy, first in (("prefix", {"idle", "decoding"}), ("least_load", {"idle"})):
        orders = {tuple(names(rank(policy, workers, prompt_tokens=1000, tie_key=k, tolerance=0.9)))
                  for k in range(40)}
        assert {o[-1] for o in orders} == {"queued"}, policy
        assert {o[0] for o in orders} == first, policy
    # ... before the work sent so far, for least_load alone.
    busy = [view("busy", model=model, in_flight=3), view("sent", model=model, assigned_prefill_tokens=5000)]
    assert {rank("least_load", busy, prompt_tokens=10, tie_key=k, tolerance=0.9)[0].worker for k in range(20)} \
        == {"sent"}
    assert {rank("prefix", busy, prompt_tokens=10, tie_key=k, tolerance=0.9)[0].worker for k in range(20)} == {"busy"}
    # Fewer tokens queued come first, and work sent so far still spreads the rest.
    two = [view("more", model=model, queued_prefill_tokens=900), view("less", model=model, queued_prefill_tokens=100)]
    assert {rank("prefix", two, prompt_tokens=10, tie_key=k, tolerance=0.9)[0].worker for k in range(20)} == {"less"}
    idle = [view("a", model=model, assigned_prefill_tokens=2000), view("b", model=model, assigned_prefill_tokens=1000)]
    assert {rank("prefix", idle, prompt_tokens=10, tie_key=k, tolerance=0.9)[0].worker for k in range(20)} == {"b"}
