"""Classic-model metrics, read from per-model statistics at scrape time.

`register(registry, manager)` adds a custom Collector; every family carries
`model` and `version` labels.

- Triton's own names (`nv_inference_*`), kept exactly as Triton exports them so
  Triton dashboards work unchanged: counters without a `_total` suffix, durations as
  cumulative microseconds, `nv_inference_request_failure` by Triton's `reason`
  (REJECTED, CANCELED, BACKEND, OTHER; see `engines.classic.stats`).
- What Triton lacks: one histogram per phase, `sluice_classic_<phase>_duration_seconds`
  (request, queue, compute_input, compute_infer, compute_output), so latency percentiles
  can be read per model, not only averages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, UntypedMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from engines.classic.stats import FAILURE_REASONS, PHASE_BUCKETS_S, PHASES, StatsSnapshot

_LABELS = ["model", "version"]
_COUNTERS = [
    # (name without _total, help, value(snapshot))
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (batch rows)", lambda s: s.inference_count),
    ("nv_inference_exec_count", "Number of model executions performed (batches)", lambda s: s.execution_count),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds",
     lambda s: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "Cumulative compute output duration in microseconds",
     lambda s: s.compute_output.ns // 1000),
]
_PHASE_HELP = {
    "request": "Classic inference requests: arrival to response, successful or not",
    "queue": "Classic inference requests: time queued in the dynamic batcher before their batch ran (successful "
             "requests)",
    "compute_input": "Classic inference requests: time their batch spent gathering inputs",
    "compute_infer": "Classic inference requests: time their batch spent in the backend's execute",
    "compute_output": "Classic inference requests: time their batch spent splitting outputs",
}
_LE = [floatToGoString(b) for b in PHASE_BUCKETS_S] + ["+Inf"]  # type: ignore[no-untyped-call]


class StatisticsSource(Protocol):
    """What the collector reads (`engines.classic.manager.ModelRepositoryManager`)."""

    def statistics(self) -> list[StatsSnapshot]:
        """A snapshot of every ready model version's statistics; called at each scrape."""


class TritonMetricsCollector(Collector):
    def __init__(self, manager: StatisticsSource) -> None:
        self._manager = manager

    def collect(self) -> Iterator[Any]:
        snapshots = self._manager.statistics()
        for name, doc, value in _COUNTERS:
            # Triton's counter names have no _total suffix; prometheus_client renames counter families to
            # *_total, which would break Triton dashboards. Untyped keeps the exact names; rate() still works.
            family = UntypedMetricFamily(name, doc, labels=_LABELS)
            for s in snapshots:
                family.add_metric([s.name, s.version], value(s))  # type: ignore[no-untyped-call]
            yield family
        failure = UntypedMetricFamily("nv_inference_request_failure",
                                      "Number of failed inference requests, all batch sizes",
                                      labels=[*_LABELS, "reason"])
        for s in snapshots:
            for reason in FAILURE_REASONS:
                failure.add_metric([s.name, s.version, reason], s.failures[reason])
        yield failure
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=_LABELS)
        for s in snapshots:
            pending.add_metric([s.name, s.version], s.pending_count)
        yield pending
        yield from _phase_histograms(snapshots)

    def describe(self) -> Iterator[Any]:
        return iter(())  # values depend on which models are loaded; collect at scrape time only


def _phase_histograms(snapshots: list[StatsSnapshot]) -> Iterator[HistogramMetricFamily]:
    for phase in PHASES:
        family = HistogramMetricFamily(f"sluice_classic_{phase}_duration_seconds", _PHASE_HELP[phase] + ".",
                                       labels=_LABELS)
        for s in snapshots:
            h = s.phases[phase]
            running, buckets = 0, []
            for le, count in zip(_LE, h.counts, strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric([s.name, s.version], buckets, h.sum_ns / 1e9)
        yield family


def register(registry: CollectorRegistry, manager: StatisticsSource) -> TritonMetricsCollector:
    collector = TritonMetricsCollector(manager)
    registry.register(collector)
    return collector
