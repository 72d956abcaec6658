"""The routing cost, in seconds: each worker's predicted time to first token, plus what it evicts, how
long the answer then decodes there, and what its prefill delays the others. Pure.

For a request of `uncached` tokens not in a worker's cache (and `cached` that are):

    ttft_s = latency_s
           + running_s × running                                        # the batch every step carries
           + token_s × (queued_prefill_tokens + uncached)               # the prefill ahead of it, then its own
           + pair_s × (queued_prefill_pairs + pairs(uncached, cached))  # their attention

    eviction_s = evicted_blocks × refill_ratio × block_size × token_s
    decode_s = running_s × running × answer_tokens
    delay_s = running × (token_s × uncached + pair_s × pairs(uncached, cached))
    cost_s = ttft_s + eviction_s + decode_s + delay_s

`TtftModel` (latency_s, running_s, token_s, pair_s) holds the worker's
coefficients, fitted online by `router.learning` to the TTFT the router
observes; `running` (requests on the worker), the queued prefill and its pairs
are the worker's load (`router.telemetry.load`); `pairs(n, c) = n·c + n(n+1)/2` is the
number of query-key pairs a prefill of n tokens after c cached ones computes.

The eviction term prices the worker's KV pressure: the blocks this request
would take beyond the worker's free ones each evict a cached block, and an
evicted block costs its recompute time times the chance that it is needed
again, which is measured per worker as the fraction of recent evictions whose
block was stored again later (`refill_ratio`).

The decode term prices the answer: each step on a worker takes `running_s`
longer per running request (the same term as in the TTFT, which waits through
one such step), and an answer is `answer_tokens` steps, the recent mean answer
length of the model (`router.learning`). So `ttft_s + decode_s` is how much
later the whole answer ends on this worker than on an idle one.

The delay term prices what the request does to the others: its prefill runs in
the steps the worker's `running` requests decode in, so each of them waits
through it. A cache hit saves the prefill twice over, once for the request and
once for everyone it shares a worker with.

Without the two, the cost saw only the request's own time to first token: it
kept a prompt group's conversations on the few workers that hold it (max over
mean work 7.3 at 64 workers on `loadtests/routing/bench_vtime.py`'s chat workload),
where answers decoded slower and every new turn's prefill held up the others.
"""

from __future__ import annotations

from typing import NamedTuple

from router.config import TtftModel
from router.telemetry.load import LoadSnapshot


def attention_pairs(uncached: int, cached: int) -> int:
    """Query-key pairs a prefill of `uncached` tokens after `cached` computed ones runs."""
    return uncached * cached + uncached * (uncached + 1) // 2


class TtftFeatures(NamedTuple):
    """What the TTFT fit regresses on (besides the constant), known at dispatch."""

    running: int  # requests on the worker
    tokens: int  # prefill tokens queued ahead plus this request's uncached ones
    pairs: int  # their attention query-key pairs

    def vector(self) -> tuple[float, float, float, float]:
        return 1.0, float(self.running), float(self.tokens), float(self.pairs)


class KvPressure(NamedTuple):
    """What the eviction term needs to know about a worker's KV cache."""

    free_blocks: int  # blocks holding nothing cached (capacity minus the blocks the index lists)
    refill_ratio: float  # of the worker's recent evictions, the fraction stored again later
    block_size: int


def features(load: LoadSnapshot, uncached: int, cached: int) -> TtftFeatures:
    return TtftFeatures(load.requests, load.queued_prefill_tokens + uncached,
                        load.queued_prefill_pairs + attention_pairs(uncached, cached))


def predict_ttft(model: TtftModel, f: TtftFeatures) -> float:
    return model.latency_s + model.running_s * f.running + model.token_s * f.tokens + model.pair_s * f.pairs


def eviction_s(model: TtftModel, kv: KvPressure | None, uncached: int) -> float:
    """Expected refill time of the cached blocks this request's prefill would evict."""
    if kv is None or kv.refill_ratio <= 0.0:
        return 0.0
    needed = -(-uncached // kv.block_size)
    evicted = needed - kv.free_blocks
    if evicted <= 0:
        return 0.0
    return evicted * kv.refill_ratio * kv.block_size * model.token_s


def decode_s(model: TtftModel, load: LoadSnapshot, answer_tokens: float) -> float:
    """How much longer an answer of `answer_tokens` decodes on this worker than on an idle one."""
    return model.running_s * load.requests * answer_tokens


def delay_s(model: TtftModel, load: LoadSnapshot, uncached: int, cached: int) -> float:
    """What this request's prefill delays the requests running on the worker, summed over them."""
    return load.requests * (model.token_s * uncached + model.pair_s * attention_pairs(uncached, cached))


def queue_s(model: TtftModel, load: LoadSnapshot) -> float:
    """The load-dependent part of the predicted TTFT: how much longer a request waits on this
    worker than on the same worker idle (the work already running or queued there)."""
    return (model.running_s * load.requests + model.token_s * load.queued_prefill_tokens
            + model.pair_s * load.queued_prefill_pairs)
