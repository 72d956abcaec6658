"""Admission by tenant and priority class, as Prometheus series; and the fairness index.

- `sluice_tenant_admitted_total`, `sluice_tenant_refused_total{reason}` (queue_full, evicted,
  deadline_unmeetable, deadline_expired), `sluice_tenant_queue_time_seconds`: per model, tenant
  and class;
- `sluice_tenant_tokens_total`: tokens served (prompt plus completion, as the engines counted);
- `sluice_llm_deadline_requests_total{outcome}`: requests with a TTFT deadline whose first token
  came in time (met, the goodput) or late (missed), or that were refused for it;
- `sluice_fairness_index`: Jain's index over the tenants that had to wait in the last window
  (`WINDOW_S`), of the tokens they were served per weight: 1 is an even share, 1/n one tenant
  taking everything. Tenants that never waited are not short of anything and are left out.

Tenant labels are bounded by the keys file (a tenant is a key's `tenant:` or id); without keys
every request is `anonymous`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.llm.admission.gate import Observer
from gateway.llm.admission.policy import Claim

WINDOW_S = 30.0
REASONS = ("queue_full", "evicted", "deadline_unmeetable", "deadline_expired")
_QUEUE_BUCKETS_S = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def jain(values: list[float]) -> float | None:
    """Jain's fairness index of `values`: (Σx)² / (n·Σx²); None for fewer than two or all zero."""
    square = sum(x * x for x in values)
    if len(values) < 2 or square == 0:
        return None
    return sum(values) ** 2 / (len(values) * square)


class _Window:
    """Served tokens per weight of the tenants that waited, over one window."""

    def __init__(self, now: float) -> None:
        self.start = now
        self.served: dict[str, float] = {}
        self.waited: set[str] = set()


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        labels = ["model", "tenant", "priority"]
        self.admitted = Counter("sluice_tenant_admitted", "LLM requests admitted, by tenant and priority class.",
                                labels, registry=registry)
        self.refused = Counter("sluice_tenant_refused", "LLM requests refused by admission, by tenant, class and "
                               "reason (queue_full, evicted, deadline_unmeetable, deadline_expired).",
                               [*labels, "reason"], registry=registry)
        self.queue_time = Histogram("sluice_tenant_queue_time_seconds", "LLM requests: time waiting for admission, "
                                    "by tenant and priority class, seconds.", labels, buckets=_QUEUE_BUCKETS_S,
                                    registry=registry)
        self.tokens = Counter("sluice_tenant_tokens", "Tokens served (prompt + completion), by tenant and class.",
                              labels, registry=registry)
        self.deadlines = Counter("sluice_llm_deadline_requests", "LLM requests with a TTFT deadline, by outcome: "
                                 "met (goodput), missed, refused.", ["model", "outcome"], registry=registry)
        self.fairness = Gauge("sluice_fairness_index", "Jain's index of the tokens per weight served to the "
                              "tenants that waited for admission in the last window (1: even).", ["model"],
                              registry=registry)
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._seen: set[tuple[str, str, str]] = set()

    def observer(self, model: str) -> Observer:
        """The model's observer; its model-wide series start now (a dashboard shows 0, not nothing)."""
        for outcome in ("met", "missed", "refused"):
            self.deadlines.labels(model, outcome)
        self.fairness.labels(model).set(1.0)  # no two tenants contended yet: nothing uneven

        def observe(event: str, claim: Claim, value: float) -> None:
            self.event(model, event, claim, value)
        return observe

    def event(self, model: str, event: str, claim: Claim, value: float) -> None:
        tenant = claim.tenant or "anonymous"
        labels = (model, tenant, claim.priority)
        if labels not in self._seen:  # bounded: the keys file's tenants x classes x models
            self._seen.add(labels)
            for reason in REASONS:
                self.refused.labels(*labels, reason)
            self.tokens.labels(*labels)
        kind, _, detail = event.partition(":")
        if kind == "admitted":
            self.admitted.labels(*labels).inc()
            self.queue_time.labels(*labels).observe(value)
            if value > 0:
                self._window(model).waited.add(tenant)
        elif kind == "refused":
            self.refused.labels(*labels, detail).inc()
            self._window(model).waited.add(tenant)
            if detail.startswith("deadline"):
                self.deadlines.labels(model, "refused").inc()
        elif kind == "served":
            self.tokens.labels(*labels).inc(value)
            window = self._window(model)
            window.served[tenant] = window.served.get(tenant, 0.0) + value / claim.weight
        elif kind == "deadline":
            self.deadlines.labels(model, detail).inc()

    def _window(self, model: str) -> _Window:
        now = self._clock()
        window = self._windows.get(model)
        if window is None or now - window.start >= WINDOW_S:
            if window is not None:
                index = jain([window.served.get(t, 0.0) for t in window.waited])
                if index is not None:
                    self.fairness.labels(model).set(index)
            window = self._windows[model] = _Window(now)
        return window
