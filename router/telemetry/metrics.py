"""Router metrics, registered on the registry the gateway owns.

All names start with ``sluice_router_``, except
``sluice_background_task_restarts_total``, which the gateway's own tasks share.
Per-worker series are labelled with the worker's stable name and removed when
the worker is removed.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Label values of the per-worker series with a second label, so that a removed worker's are found.
KV_RESET_REASONS = ("gap", "restart", "malformed", "error")
WORKER_TASKS = ("health", "scrape", "kv-events")
_TOKEN_BUCKETS = (0, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
_TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_DECISION_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1)


class RouterMetrics:
    """Prometheus series plus the rolling closed-loop accuracy window."""

    def __init__(self, registry: CollectorRegistry, accuracy_window: int) -> None:
        r = registry
        self.decisions = Counter("sluice_router_decisions", "Routing decisions by policy and reason.",
                                 ["policy", "reason"], registry=r)
        self.predicted_tokens = Counter("sluice_router_predicted_cached_tokens",
                                        "Cached prompt tokens the router predicted (requests whose engine reported its "
                                        "own count).", registry=r)
        self.reported_tokens = Counter("sluice_router_reported_cached_tokens",
                                       "Cached prompt tokens the engines reported.", registry=r)
        self.prediction_error = Histogram("sluice_router_cached_tokens_abs_error_tokens",
                                          "|predicted - reported| cached prompt tokens per request, tokens.",
                                          buckets=_TOKEN_BUCKETS, registry=r)
        self.predictions = Counter("sluice_router_predictions",
                                   "Finished requests by prediction outcome "
                                   "(within_block, over, under).", ["outcome"], registry=r)
        self.accuracy = Gauge("sluice_router_prediction_accuracy_ratio",
                              "Fraction of recent requests whose predicted cached tokens were within "
                              "one block of the engine's report (0..1).", registry=r)
        self.healthy = Gauge("sluice_router_worker_healthy", "1 if the worker takes new requests, else 0.",
                             ["worker"], registry=r)
        self.breaker = Gauge("sluice_router_worker_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open.",
                             ["worker"], registry=r)
        self.checks_excused = Counter("sluice_router_health_checks_excused",
                                      "Failed health checks not counted because the worker had just "
                                      "delivered a first token or an answer (busy, not dead).",
                                      ["worker"], registry=r)
        self.in_flight = Gauge("sluice_router_worker_in_flight", "Requests in flight from this gateway replica.",
                               ["worker"], registry=r)
        self.index_blocks = Gauge("sluice_router_index_blocks",
                                  "KV blocks indexed for the worker (exact and speculative entries).",
                                  ["worker"], registry=r)
        self.kv_events = Counter("sluice_router_kv_events", "KV events applied.", ["worker"], registry=r)
        self.kv_gaps = Counter("sluice_router_kv_event_gaps", "KV event sequence gaps seen.",
                               ["worker"], registry=r)
        self.kv_replays = Counter("sluice_router_kv_event_replays", "KV event replays that filled a gap.",
                                  ["worker"], registry=r)
        self.kv_lag = Gauge("sluice_router_kv_event_lag_seconds",
                            "Receive time minus engine publish time of the last KV event batch, seconds.",
                            ["worker"], registry=r)
        self.kv_resets = Counter("sluice_router_kv_index_resets",
                                 "Times a worker's exact index entries were dropped because KV-event "
                                 "continuity was lost (gap, restart, malformed, error).", ["worker", "reason"],
                                 registry=r)
        self.task_restarts = Counter("sluice_background_task_restarts",
                                     "Background tasks restarted after they failed (task; worker, if any).",
                                     ["task", "worker"], registry=r)
        self._cost_series(r)
        self._window: deque[bool] = deque(maxlen=accuracy_window)

    def _cost_series(self, r: CollectorRegistry) -> None:
        """The routing cost's own check (predicted against actual TTFT) and the decision's time."""
        self.predicted_ttft = Histogram("sluice_router_predicted_ttft_seconds",
                                        "Time to first token the routing cost predicted for each dispatched "
                                        "request, by the worker it was sent to, seconds.", ["worker"],
                                        buckets=_TTFT_BUCKETS_S, registry=r)
        self.actual_ttft = Histogram("sluice_router_actual_ttft_seconds",
                                     "Observed time to first token (dispatch to first token) of the same "
                                     "requests, by worker, seconds.", ["worker"], buckets=_TTFT_BUCKETS_S, registry=r)
        self.ttft_error = Histogram("sluice_router_ttft_prediction_error_seconds",
                                    "|predicted - actual| time to first token per request, by worker, seconds.",
                                    ["worker"], buckets=_TTFT_BUCKETS_S, registry=r)
        self.answer_tokens = Gauge("sluice_router_answer_tokens",
                                   "Recent mean answer length of the model's requests that ran to their end, "
                                   "tokens: what the prefix cost prices a new request's decode with.", ["model"],
                                   registry=r)
        self.decision = Histogram("sluice_router_decision_seconds",
                                  "Wall time of one routing decision (ranking the workers), seconds.",
                                  buckets=_DECISION_BUCKETS_S, registry=r)

    def observe_prediction(self, predicted: int, reported: int, block_size: int) -> None:
        """One finished request with an engine-reported cached token count."""
        self.predicted_tokens.inc(predicted)
        self.reported_tokens.inc(reported)
        err = predicted - reported
        self.prediction_error.observe(abs(err))
        within = abs(err) <= block_size
        self.predictions.labels("within_block" if within else ("over" if err > 0 else "under")).inc()
        self._window.append(within)
        self.accuracy.set(sum(self._window) / len(self._window))

    def init_worker(self, worker: str, has_events: bool) -> None:
        """Start a new worker's counters at 0, so that rate() and alerts see them before any event."""
        tasks = ("health", "scrape", "kv-events") if has_events else ("health", "scrape")
        self.checks_excused.labels(worker)
        for task in tasks:
            self.task_restarts.labels(task, worker)
        if has_events:
            for c in (self.kv_events, self.kv_gaps, self.kv_replays):
                c.labels(worker)
            for reason in KV_RESET_REASONS:
                self.kv_resets.labels(worker, reason)

    def observe_ttft(self, worker: str, predicted_s: float, actual_s: float) -> None:
        """One request's first token arrived `actual_s` after its dispatch (predicted: `predicted_s`)."""
        self.actual_ttft.labels(worker).observe(actual_s)
        self.ttft_error.labels(worker).observe(abs(predicted_s - actual_s))

    def forget_worker(self, worker: str) -> None:
        for g in (self.healthy, self.breaker, self.checks_excused, self.in_flight, self.index_blocks, self.kv_events,
                  self.kv_gaps, self.kv_replays, self.kv_lag, self.predicted_ttft, self.actual_ttft,
                  self.ttft_error):
            try:
                g.remove(worker)
            except KeyError:
                pass
        pairs = [(self.kv_resets, (worker, reason)) for reason in KV_RESET_REASONS]
        pairs += [(self.task_restarts, (task, worker)) for task in WORKER_TASKS]
        for c, labels in pairs:
            try:
                c.remove(*labels)
            except KeyError:
                pass
