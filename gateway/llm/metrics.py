"""The gateway's Prometheus registry and the LLM metric set.

One `CollectorRegistry` per app (tests start several apps in one process).
Router and KServe collectors register onto the same registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engines.base import EngineStats

if TYPE_CHECKING:
    from gateway.llm.registry import LLMModel

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class LLMMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("sluice_requests", "HTTP requests answered, by route template, model and status code.",
                                ["route", "model", "status"], registry=r)
        self.prompt_tokens = Counter("sluice_prompt_tokens", "Prompt tokens processed, by model.", ["model"],
                                     registry=r)
        self.generation_tokens = Counter("sluice_generation_tokens", "Completion tokens generated, by model.",
                                         ["model"], registry=r)
        self.cached_tokens = Counter("sluice_cached_prompt_tokens",
                                     "Prompt tokens the engine served from its prefix cache.", ["model"], registry=r)
        self.ttft = Histogram("sluice_time_to_first_token_seconds",
                              "LLM requests: time from dispatch to the first token, seconds.", ["model"],
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.itl = Histogram("sluice_inter_token_latency_seconds",
                             "LLM requests: time between two streamed deltas, seconds.", ["model"],
                             buckets=_ITL_BUCKETS_S, registry=r)
        self.e2e = Histogram("sluice_e2e_request_latency_seconds",
                             "LLM requests: time from dispatch to the last delta, seconds.", ["model"],
                             buckets=_LATENCY_BUCKETS_S, registry=r)
        self.queue_time = Histogram("sluice_queue_time_seconds",
                                    "LLM requests: time waiting for admission (max_running), seconds.", ["model"],
                                    buckets=_LATENCY_BUCKETS_S, registry=r)
        self.inflight = Gauge("sluice_requests_inflight",
                              "LLM requests admitted and not finished, by model (this replica).", ["model"], registry=r)
        self.queued = Gauge("sluice_requests_queued", "LLM requests waiting for admission, by model (this replica).",
                            ["model"], registry=r)
        self.retries = Counter("sluice_request_retries", "Requests moved to the next-ranked worker after a "
                               "failure before the first byte.", ["model"], registry=r)
        self.migrations = Counter(
            "sluice_llm_migrations", "Streams whose worker was lost mid-answer, by cause (broken: its connection "
            "failed; stalled: silent past --worker-stall-timeout-s) and outcome (resumed, or why not).",
            ["model", "cause", "outcome"], registry=r)
        self.migration_pause = Histogram(
            "sluice_llm_migration_pause_seconds", "Resumed streams: time from the client's last delta before the "
            "fault to its first delta from the next worker, seconds.", ["model"], buckets=_LATENCY_BUCKETS_S,
            registry=r)
        self.inflight_limit = Gauge("sluice_requests_inflight_limit",
                                    "Admitted LLM requests a model may have at once (--max-running, else its "
                                    "capacity).", ["model"], registry=r)
        self.queued_limit = Gauge("sluice_requests_queued_limit",
                                  "LLM requests a model may have waiting before 503 (--max-queued, else 1x "
                                  "the running limit).", ["model"], registry=r)
        self.capacity = Gauge("sluice_model_capacity",
                              "Engine requests a model's healthy workers run at once: the sum of their batch "
                              "bounds (vLLM max_num_seqs, TensorRT-LLM max_batch_size, ...).", ["model"],
                              registry=r)
        self.finished = Counter("sluice_request_finished", "Finished generations (one per choice), by model and "
                                "finish reason (stop, length, abort, error...).", ["model", "finish_reason"],
                                registry=r)


    def model_changed(self, model: str, added: bool) -> None:
        """A model was added (its series start at 0, so rate() and alerts see it before any event)
        or removed (its gauges go)."""
        if not added:
            for gauge in (self.inflight_limit, self.queued_limit, self.capacity, self.inflight, self.queued):
                try:
                    gauge.remove(model)
                except KeyError:
                    pass
            return
        for series in (self.inflight, self.queued, self.retries, self.prompt_tokens, self.generation_tokens,
                       self.cached_tokens):
            series.labels(model)


    def limits_changed(self, model: LLMModel) -> None:
        a = model.admission
        self.capacity.labels(model.name).set(a.capacity)
        self.inflight_limit.labels(model.name).set(a.max_running)
        self.queued_limit.labels(model.name).set(a.max_queued)


class EngineStatsCollector(Collector):
    """Exports each in-process engine's scheduler snapshot at scrape time, labelled by model and
    worker (the target name, `local` for the gateway's own engine), so that no two engines share
    a series. Remote workers' own counts come from the router (`sluice_router_worker_requests_*`,
    scraped from the worker) and from the worker's own /metrics."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, str, EngineStats]]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["model", "worker"]
        running = GaugeMetricFamily("sluice_engine_requests_running",
                                    "Requests in the in-process engine's running batch.", labels=labels)
        waiting = GaugeMetricFamily("sluice_engine_requests_waiting",
                                    "Requests queued inside the in-process engine.", labels=labels)
        batch = GaugeMetricFamily("sluice_engine_max_batch_size",
                                  "Largest batch (requests) the engine has run since start.", labels=labels)
        steps = CounterMetricFamily("sluice_engine_steps", "Forward passes the engine has run.", labels=labels)
        batched = CounterMetricFamily("sluice_engine_batched_steps",
                                      "Forward passes that ran more than one request.", labels=labels)
        restarts = CounterMetricFamily("sluice_engine_restarts",
                                       "Times the engine's supervisor restarted it after its generation loop "
                                       "died.", labels=labels)
        for model, worker, stats in self._source():
            key = [model, worker]
            running.add_metric(key, stats.running)
            waiting.add_metric(key, stats.waiting)
            batch.add_metric(key, stats.max_batch_size_seen)
            steps.add_metric(key, stats.steps)
            batched.add_metric(key, stats.batched_steps)
            restarts.add_metric(key, stats.restarts)
        yield from (running, waiting, batch, steps, batched, restarts)


class ModelReadyCollector(Collector):
    """`sluice_model_ready{model}`: 1 while an LLM can serve (its in-process engine is up, or a healthy
    worker serves it), else 0; read at scrape time. /health counts them; the names are here."""

    def __init__(self, source: Callable[[], dict[str, bool]]) -> None:
        self._source = source

    def collect(self) -> Iterable[GaugeMetricFamily]:
        ready = GaugeMetricFamily("sluice_model_ready", "1 while the LLM can serve here, else 0.", labels=["model"])
        for model, up in sorted(self._source().items()):
            ready.add_metric([model], 1 if up else 0)
        yield ready


class RelayEventsCollector(Collector):
    """Exports, at scrape time, how many of each remote worker's stream events the gateway read
    through a plain-chunk template (`spliced`) and how many it decoded in full (`decoded`;
    engines.remote.splice); plain counts on the engines, so relaying a token touches no metric."""

    def __init__(self, source: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self._source = source  # (worker, spliced, decoded)

    def collect(self) -> Iterable[CounterMetricFamily]:
        events = CounterMetricFamily("sluice_relay_events", "Events of remote workers' streams, by worker and by how "
                                     "the gateway read them: spliced (plain text relayed from the worker's bytes) "
                                     "or decoded (in full).", labels=["worker", "path"])
        for worker, spliced, decoded in self._source():
            events.add_metric([worker, "spliced"], spliced)
            events.add_metric([worker, "decoded"], decoded)
        yield events
