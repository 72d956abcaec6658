"""Per-model-version statistics in the shape of Triton's statistics extension.

Durations are nanoseconds. The scheduler records into `ModelStats` from the event
loop; readers (HTTP/gRPC/Prometheus) take a `snapshot()`, guarded by a lock so a
scrape from another thread sees consistent numbers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(slots=True)
class StatsSnapshot:
    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0  # inferences (batch rows), Triton's definition
    execution_count: int = 0  # backend executions; < inference_count proves batching
    pending_count: int = 0  # requests queued or executing right now
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batch_stats: dict[int, BatchStat] = field(default_factory=dict)


class ModelStats:
    """Mutable counters of one model version."""

    def __init__(self, name: str, version: str) -> None:
        self._lock = threading.Lock()
        self._s = StatsSnapshot(name, version)

    def request_started(self) -> None:
        with self._lock:
            self._s.pending_count += 1

    def request_done(self, ok: bool, total_ns: int, queue_ns: int | None = None) -> None:
        """One request finished (successfully or not) after `total_ns` since it arrived."""
        with self._lock:
            self._s.pending_count -= 1
            (self._s.success if ok else self._s.fail).add(total_ns)
            if ok and queue_ns is not None:
                self._s.queue.add(queue_ns)

    def execution(self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One backend execution of `requests` requests holding `rows` batch rows."""
        with self._lock:
            s = self._s
            s.execution_count += 1
            s.inference_count += rows
            s.last_inference_ms = int(time.time() * 1000)
            # Triton attributes the batch's compute time to each request in it.
            s.compute_input.add(input_ns * requests, requests)
            s.compute_infer.add(infer_ns * requests, requests)
            s.compute_output.add(output_ns * requests, requests)
            batch = s.batch_stats.setdefault(rows, BatchStat())
            batch.compute_input.add(input_ns)
            batch.compute_infer.add(infer_ns)
            batch.compute_output.add(output_ns)

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            s = self._s
            return StatsSnapshot(
                s.name, s.version, s.last_inference_ms, s.inference_count, s.execution_count,
                s.pending_count, Duration(s.success.count, s.success.ns), Duration(s.fail.count, s.fail.ns),
                Duration(s.queue.count, s.queue.ns), Duration(s.compute_input.count, s.compute_input.ns),
                Duration(s.compute_infer.count, s.compute_infer.ns),
                Duration(s.compute_output.count, s.compute_output.ns),
                {k: BatchStat(Duration(v.compute_input.count, v.compute_input.ns),
                              Duration(v.compute_infer.count, v.compute_infer.ns),
                              Duration(v.compute_output.count, v.compute_output.ns))
                 for k, v in s.batch_stats.items()},
            )
