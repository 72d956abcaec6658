"""A model's capacity: the engine requests its healthy workers can run at once, and the
admission limits derived from it (gateway.llm.admission).

Each worker's capacity is the engine's own batch bound: vLLM's `max_num_seqs`, TensorRT-LLM's
`max_batch_size`, the sim's `max_num_seqs`, the in-process engine's batch size. It travels in the
worker record (`WorkerRecord.capacity`: the launcher and the sim fill it in; a static worker's is
read from what it reports, gateway.llm.workers.probe). A worker whose capacity is unknown counts
as `DEFAULT_WORKER_CAPACITY`. A model's capacity is the sum over its workers that take requests
(healthy, not draining, breaker not open); it follows them as they come, go and recover.

Admission lets that many engine requests run, and as many again wait in the gateway
(`QUEUE_FACTOR`): a queued request then starts within about one answer's time (every running
slot turns over once), while a burst of twice the fleet's batch is still absorbed; beyond it the
client gets a fast 503 with Retry-After rather than a wait of several answers. Excess the
engines cannot run at once (a KV cache that fits fewer sequences than `max_num_seqs`) waits in
the engine's own queue, which the router's load signals see (vLLM's `num_requests_waiting`).

With `--frontends N` each frontend admits its share of the capacity (`frontend_share`): the kernel
spreads connections evenly over the frontends, and the shares add up to the fleet's capacity, as
the `sluice_model_capacity` samples of all frontends do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from router import BreakerState, WorkerStatus

# vLLM's default max_num_seqs for its OpenAI server on GPUs under 70 GiB (vllm/engine/arg_utils.py);
# a worker that says nothing of its batch bound is assumed to take this many requests at once.
DEFAULT_WORKER_CAPACITY = 256
QUEUE_FACTOR = 1  # gateway queue places per unit of capacity (see the module docstring)


def takes_requests(w: WorkerStatus) -> bool:
    return w.healthy and not w.draining and w.breaker is not BreakerState.OPEN


def model_capacity(model: str, workers: Iterable[WorkerStatus], capacities: Mapping[str, int | None]) -> int:
    """The sum of the capacities (unknown: the default) of `model`'s workers that take requests."""
    return sum(capacities.get(w.name) or DEFAULT_WORKER_CAPACITY
               for w in workers if model in w.models and takes_requests(w))


def derived_limits(capacity: int, max_running: int | None, max_queued: int | None) -> tuple[int, int]:
    """(running, queued) limits: an explicit override, else derived from `capacity`. The running
    limit is at least 1 (a model whose workers all left refuses at routing, not here)."""
    running = max_running if max_running is not None else max(1, capacity)
    queued = max_queued if max_queued is not None else QUEUE_FACTOR * running
    return running, queued


def frontend_share(capacity: int, index: int, count: int) -> int:
    """Frontend `index` of `count`'s part of `capacity`: the parts differ by at most one and add up to it."""
    return capacity // count + (1 if index < capacity % count else 0)
