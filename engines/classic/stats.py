"""Per-model-version statistics in the shape of Triton's statistics extension.

Durations are nanoseconds. The scheduler records into `ModelStats` from the event
loop; readers (HTTP/gRPC/Prometheus) take a `snapshot()`, guarded by a lock so a
scrape from another thread sees consistent numbers.

Beyond Triton's cumulative durations, each phase (request, queue, compute input,
infer, output) keeps a histogram with fixed buckets, so percentiles can be read
(`sluice_classic_*_duration_seconds`). Recording one costs a bisect and two
integer additions under the lock the counters already take.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from typing import Any

# Triton's reasons for a failed request (`nv_inference_request_failure{reason}`): refused by the
# scheduler (queue full, queue timeout, model unloading), cancelled by its client, failed in the
# backend's execute, anything else (an invalid request, a scheduler fault).
REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)
PHASES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
# Upper bounds of the phase histograms' buckets, in seconds: 50 µs (a small ONNX batch) to 60 s.
PHASE_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BOUNDS_NS = tuple(round(b * 1e9) for b in PHASE_BUCKETS_S)


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class PhaseHistogram:
    """Observations per bucket of `PHASE_BUCKETS_S` (not cumulative; the last bucket is +Inf)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(_BOUNDS_NS) + 1))
    sum_ns: int = 0

    def observe(self, ns: int, times: int = 1) -> None:
        self.counts[bisect_left(_BOUNDS_NS, ns)] += times  # a value on a bound belongs to that bucket (le)
        self.sum_ns += ns * times

    def copy(self) -> PhaseHistogram:
        return PhaseHistogram(list(self.counts), self.sum_ns)


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
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    phases: dict[str, PhaseHistogram] = field(default_factory=lambda: {p: PhaseHistogram() for p in PHASES})


class ModelStats:
    """Mutable counters of one model version."""

    def __init__(self, name: str, version: str) -> None:
        self._lock = threading.Lock()
        self._s = StatsSnapshot(name, version)

    def request_started(self) -> None:
        with self._lock:
            self._s.pending_count += 1

    def request_done(self, ok: bool, total_ns: int, queue_ns: int | None = None, reason: str = OTHER) -> None:
        """One request finished (successfully or not) after `total_ns` since it arrived; a failed
        one is counted under `reason` (one of `FAILURE_REASONS`)."""
        with self._lock:
            s = self._s
            s.pending_count -= 1
            (s.success if ok else s.fail).add(total_ns)
            s.phases["request"].observe(total_ns)
            if not ok:
                s.failures[reason] += 1
            elif queue_ns is not None:
                s.queue.add(queue_ns)
                s.phases["queue"].observe(queue_ns)

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
            s.phases["compute_input"].observe(input_ns, requests)
            s.phases["compute_infer"].observe(infer_ns, requests)
            s.phases["compute_output"].observe(output_ns, requests)
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
                dict(s.failures), {p: h.copy() for p, h in s.phases.items()},
            )


def merge_snapshots(parts: list[StatsSnapshot]) -> StatsSnapshot:
    """One version's statistics summed over the processes that serve it (`--frontends N`):
    counts and durations add, `last_inference` is the latest."""
    total = StatsSnapshot(parts[0].name, parts[0].version)
    for s in parts:
        total.last_inference_ms = max(total.last_inference_ms, s.last_inference_ms)
        total.inference_count += s.inference_count
        total.execution_count += s.execution_count
        total.pending_count += s.pending_count
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            part: Duration = getattr(s, key)
            getattr(total, key).add(part.ns, part.count)
        for size, b in s.batch_stats.items():
            into = total.batch_stats.setdefault(size, BatchStat())
            for key in ("compute_input", "compute_infer", "compute_output"):
                part = getattr(b, key)
                getattr(into, key).add(part.ns, part.count)
        for reason, n in s.failures.items():
            total.failures[reason] = total.failures.get(reason, 0) + n
        for phase, h in s.phases.items():
            into_h = total.phases.setdefault(phase, PhaseHistogram())
            into_h.counts = [a + b for a, b in zip(into_h.counts, h.counts, strict=True)]
            into_h.sum_ns += h.sum_ns
    return total


def snapshot_to_dict(s: StatsSnapshot) -> dict[str, Any]:
    return asdict(s)


def snapshot_from_dict(d: dict[str, Any]) -> StatsSnapshot:
    """The inverse of `snapshot_to_dict` (JSON keys of `batch_stats` come back as strings)."""
    def duration(x: dict[str, Any]) -> Duration:
        return Duration(int(x["count"]), int(x["ns"]))

    return StatsSnapshot(
        str(d["name"]), str(d["version"]), int(d["last_inference_ms"]), int(d["inference_count"]),
        int(d["execution_count"]), int(d["pending_count"]), duration(d["success"]), duration(d["fail"]),
        duration(d["queue"]), duration(d["compute_input"]), duration(d["compute_infer"]),
        duration(d["compute_output"]),
        {int(k): BatchStat(duration(v["compute_input"]), duration(v["compute_infer"]), duration(v["compute_output"]))
         for k, v in d["batch_stats"].items()},
        {str(k): int(v) for k, v in d["failures"].items()},
        {str(k): PhaseHistogram([int(c) for c in v["counts"]], int(v["sum_ns"])) for k, v in d["phases"].items()},
    )
