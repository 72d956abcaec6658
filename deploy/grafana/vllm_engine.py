"""The vLLM engine dashboard (built by build.py): vLLM's own `vllm:*` series, as each vLLM worker
exports them on its /metrics (vLLM 0.32's names, from vllm/v1/metrics/loggers.py), where the
other dashboards show the gateway's view. Every selector filters by `$namespace`, `$job`,
`$model_name` (vLLM's label: the served model name) and `$instance` (one worker's target).

A prometheus_client counter `vllm:x` is exposed as `vllm:x_total`, a histogram as `vllm:x_bucket`
and the rest; tests/deploy/test_dashboards.py checks every family queried here against the
installed vLLM's source.
"""

from __future__ import annotations

from build import RATE, SCOPE, dashboard, quantiles, series, variable, with_panels
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard

ENGINE = "vllm:num_requests_running"  # a gauge every vLLM server exports from its start
V = SCOPE + ', model_name=~"$model_name", instance=~"$instance"'
BY = "model_name, instance"
LEGEND = "{{model_name}} {{instance}}"


def _per_worker(metric: str) -> str:
    """A counter's rate, per model and worker."""
    return f"sum by ({BY}) (rate({metric}{{{V}}}[{RATE}]))"


def _latency(title: str, family: str, description: str = "") -> timeseries.Panel:
    return series(title, "s", *quantiles(family, "model_name", V, (0.5, 0.99)), description=description, width=8)


def vllm_engine() -> Dashboard:
    board = dashboard("sluice-vllm-engine", "Sluice / vLLM engine",
                      "vLLM's own metrics from each worker's /metrics: scheduler, KV cache, latency, tokens.",
                      ENGINE, variable("model_name", "Model", ENGINE),
                      variable("instance", "Worker", ENGINE, scope=SCOPE + ', model_name=~"$model_name"'))
    hits, queries = _per_worker("vllm:prefix_cache_hits_total"), _per_worker("vllm:prefix_cache_queries_total")
    return with_panels(board, [
        ("Scheduler and KV cache", [
            series("Running and waiting requests", "short",
                   (f"sum by ({BY}) (vllm:num_requests_running{{{V}}})", f"running {LEGEND}"),
                   (f"sum by ({BY}) (vllm:num_requests_waiting{{{V}}})", f"waiting {LEGEND}"),
                   description="The engine's running batch, and the requests its scheduler holds back."),
            series("KV-cache usage", "percentunit",
                   (f"max by ({BY}) (vllm:kv_cache_usage_perc{{{V}}})", LEGEND),
                   description="vLLM's share of KV-cache blocks in use (1 = full: new requests wait, or preempt)."),
            series("Prefix-cache hit rate (share of queried prompt tokens)", "percentunit",
                   (f"{hits} / {queries}", LEGEND)),
            series("Preemptions/s", "short", (_per_worker("vllm:num_preemptions_total"), LEGEND),
                   description="Requests evicted from the batch for KV space, to be recomputed later."),
        ]),
        ("Latency (vLLM's histograms)", [
            _latency("Time to first token", "vllm:time_to_first_token_seconds",
                     "From the engine's receipt of the request; the gateway's own TTFT is on the LLM overview."),
            _latency("Inter-token latency", "vllm:inter_token_latency_seconds"),
            _latency("Time per output token (per request)", "vllm:request_time_per_output_token_seconds"),
            _latency("End-to-end request latency", "vllm:e2e_request_latency_seconds"),
            _latency("Time in the engine's queue", "vllm:request_queue_time_seconds"),
        ]),
        ("Tokens and outcomes", [
            series("Tokens/s", "short", (_per_worker("vllm:prompt_tokens_total"), f"prompt {LEGEND}"),
                   (_per_worker("vllm:generation_tokens_total"), f"generated {LEGEND}")),
            series("Finished requests by reason", "reqps",
                   (f"sum by (model_name, finished_reason) (rate(vllm:request_success_total{{{V}}}[{RATE}]))",
                    "{{finished_reason}} {{model_name}}")),
        ]),
    ])
