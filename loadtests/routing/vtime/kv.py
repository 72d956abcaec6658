"""The sim's KV events as the router's ZMQ subscriber would hand them to `router.feed`.

`wire=True` goes the whole way: the engine's events are encoded as the msgpack
`EventBatch` vLLM publishes (`engines.sim.model.kv_events.encode_batch`) and decoded
by the router's own decoder (`router.index.events.decode_vllm_batch`), as the
subscriber does. `wire=False` builds the same decoded dataclasses directly,
skipping msgpack and the per-token checks, which is most of the cost on long
prompts; `tests/loadtests/routing/test_vtime_fleet.py` checks that both give the
router the same events.
"""

from __future__ import annotations

from collections.abc import Sequence

from engines.sim.model import kv_events as sim
from router.index import events as rt


def to_router_batch(ts: float, events: Sequence[sim.KVEvent], *, wire: bool) -> rt.EventBatch:
    if wire:
        return rt.decode_vllm_batch(sim.encode_batch(ts, events))
    return rt.EventBatch(ts, tuple(_event(e) for e in events), 0)


def _event(e: sim.KVEvent) -> rt.KVEvent:
    if isinstance(e, sim.BlockStored):
        extra: list[tuple[str, ...] | None] = [None] * len(e.block_hashes)
        if e.cache_salt is not None and e.parent_block_hash is None and extra:
            extra[0] = (e.cache_salt,)
        return rt.BlockStored(e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size, None,
                              tuple(extra), sim.MEDIUM_GPU, 0)
    if isinstance(e, sim.BlockRemoved):
        return rt.BlockRemoved(e.block_hashes, sim.MEDIUM_GPU, 0)
    return rt.AllBlocksCleared()
