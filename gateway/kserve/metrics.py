"""Triton-named Prometheus metrics for classic models, read from per-model statistics at scrape time.

`register(registry, manager)` adds a custom Collector; every family carries
`model` and `version` labels. Durations are cumulative microseconds, as Triton's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, UntypedMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

_LABELS = ["model", "version"]
_COUNTERS = [
    # (name without _total, help, value(snapshot))
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", lambda s: s.fail.count),
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


class TritonMetricsCollector(Collector):
    def __init__(self, manager: Any) -> None:
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
        pending = GaugeMetricFamily("nv_inference_pending_request_count",
                                    "Instantaneous number of pending requests awaiting execution per-model.",
                                    labels=_LABELS)
        for s in snapshots:
            pending.add_metric([s.name, s.version], s.pending_count)
        yield pending

    def describe(self) -> Iterator[Any]:
        return iter(())  # values depend on which models are loaded; collect at scrape time only


def register(registry: CollectorRegistry, manager: Any) -> TritonMetricsCollector:
    collector = TritonMetricsCollector(manager)
    registry.register(collector)
    return collector
