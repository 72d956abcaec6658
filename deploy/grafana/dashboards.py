"""The dashboards (built by build.py): LLM overview, routing and cache, classic models,
workers and health, vLLM engine. Each panel's queries are plain PromQL over the series in
docs/observability.md, every selector filtered by `$namespace` and `$job` (S); `$model` /
`$worker` are the dashboards' other multi-valued variables. The vLLM engine dashboard is in
vllm_engine.py."""

from __future__ import annotations

from collections.abc import Callable

from build import RATE, SCOPE, dashboard, quantiles, series, single, variable, with_panels
from grafana_foundation_sdk.builders.dashboard import Dashboard
from vllm_engine import vllm_engine

GATEWAY = "sluice_event_loop_lag_last_seconds"  # on every gateway's /metrics, from its start
S = SCOPE
M = S + ', model=~"$model"'
W = S + ', worker=~"$worker"'


def _rate(metric: str, selector: str = S, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{selector}}}[{RATE}]))"


def llm_overview() -> Dashboard:
    board = dashboard("sluice-llm-overview", "Sluice / LLM overview",
                      "LLM traffic through the gateway: requests, latency, tokens, errors.", GATEWAY,
                      variable("model", "Model", "sluice_time_to_first_token_seconds_count"))
    five_xx = _rate("sluice_requests_total", M + ',status=~"5.."')
    errors_5xx = f'({five_xx} or vector(0)) / {_rate("sluice_requests_total", M)}'
    return with_panels(board, [
        ("Traffic", [
            single("Requests/s", "reqps", _rate("sluice_requests_total", M)),
            single("5xx ratio", "percentunit", errors_5xx),
            single("In flight", "short", f"sum(sluice_requests_inflight{{{M}}})"),
            single("Waiting for admission", "short", f"sum(sluice_requests_queued{{{M}}})"),
            series("Requests by status", "reqps", (_rate("sluice_requests_total", M, "status"), "{{status}}")),
            series("Errors by route and status", "reqps",
                   (_rate("sluice_requests_total", M + ',status=~"[45].."', "route, status"),
                    "{{status}} {{route}}")),
        ]),
        ("Latency", [
            series("Time to first token", "s", *quantiles("sluice_time_to_first_token_seconds", "", M),
                   description="From dispatch (after admission) to the first token, as the gateway saw it."),
            series("Inter-token latency", "s", *quantiles("sluice_inter_token_latency_seconds", "", M)),
            series("End-to-end latency", "s", *quantiles("sluice_e2e_request_latency_seconds", "", M, (0.5, 0.99))),
            series("Time waiting for admission (p99)", "s",
                   *quantiles("sluice_queue_time_seconds", "model", M, (0.99,))),
        ]),
        ("Tokens and outcomes", [
            series("Tokens/s", "short", (_rate("sluice_generation_tokens_total", M, "model"), "generated {{model}}"),
                   (_rate("sluice_prompt_tokens_total", M, "model"), "prompt {{model}}"),
                   (_rate("sluice_cached_prompt_tokens_total", M, "model"), "prompt, cached {{model}}")),
            series("Finished generations by reason", "short",
                   (_rate("sluice_request_finished_total", M, "finish_reason"), "{{finish_reason}}")),
            series("Failovers before the first byte", "short",
                   (_rate("sluice_request_retries_total", M, "model"), "{{model}}")),
            series("Admission: in flight and waiting, against the limits", "short",
                   (f"sum by (model) (sluice_requests_inflight{{{M}}})", "in flight {{model}}"),
                   (f"sum by (model) (sluice_requests_queued{{{M}}})", "waiting {{model}}"),
                   (f"max by (model) (sluice_requests_queued_limit{{{M}}})", "waiting limit {{model}}")),
        ]),
        ("Tenants, priority classes and deadlines", [
            series("Admission wait by tenant and class (p99)", "s",
                   ("histogram_quantile(0.99, sum by (le, tenant, priority) "
                    f"(rate(sluice_tenant_queue_time_seconds_bucket{{{M}}}[{RATE}])))", "p99 {{tenant}} {{priority}}"),
                   description="Fair queuing within a class, strict priority between classes."),
            series("Admitted and refused by tenant", "reqps",
                   (_rate("sluice_tenant_admitted_total", M, "tenant, priority"), "admitted {{tenant}} {{priority}}"),
                   (_rate("sluice_tenant_refused_total", M, "tenant, reason"), "refused {{tenant}} {{reason}}")),
            series("Tokens served by tenant", "short",
                   (_rate("sluice_tenant_tokens_total", M, "tenant"), "{{tenant}}")),
            series("Fairness index (Jain, tenants that waited)", "short",
                   (f"min by (model) (sluice_fairness_index{{{M}}})", "{{model}}"),
                   description="Over the last window's tokens per weight of the tenants that had to wait: 1 is "
                               "an even share."),
            series("Requests with a TTFT deadline", "reqps",
                   (_rate("sluice_llm_deadline_requests_total", M, "outcome"), "{{outcome}}"),
                   description="met is the goodput; refused ones were predicted late or passed it waiting."),
        ]),
    ])


def routing_cache() -> Dashboard:
    board = dashboard("sluice-routing-cache", "Sluice / Routing and cache",
                      "The router: cache-hit predictions against the engines' reports, decisions, load, KV events.",
                      GATEWAY, variable("worker", "Worker", "sluice_router_worker_healthy"))
    predicted, reported = (_rate("sluice_router_predicted_cached_tokens_total", S),
                           _rate("sluice_router_reported_cached_tokens_total", S))
    return with_panels(board, [
        ("Prefix cache: predicted against reported", [
            series("Cached prompt tokens/s", "short", (predicted, "predicted by the router"),
                   (reported, "reported by the engines"),
                   description="Over the same requests: those whose engine reported cached tokens."),
            series("Prefix-cache hit rate (share of prompt tokens)", "percentunit",
                   (f'{_rate("sluice_cached_prompt_tokens_total", S, "model")} / '
                    f'{_rate("sluice_prompt_tokens_total", S, "model")}', "reported {{model}}"),
                   (f"{predicted} / {reported}", "predicted ÷ reported (1 = exact)")),
            series("Prediction outcomes", "short",
                   (_rate("sluice_router_predictions_total", S, "outcome"), "{{outcome}}")),
            series("Prediction accuracy and error", "short",
                   (f"max(sluice_router_prediction_accuracy_ratio{{{S}}})", "within one block (ratio)"),
                   *quantiles("sluice_router_cached_tokens_abs_error_tokens", "", S, (0.5, 0.9))),
        ]),
        ("Decisions and load", [
            series("Decisions by policy and reason", "short",
                   (_rate("sluice_router_decisions_total", S, "policy, reason"), "{{policy}} {{reason}}")),
            series("Decision time", "s", *quantiles("sluice_router_decision_seconds", "", S, (0.5, 0.99))),
            series("Load imbalance", "short", (f"max(sluice_router_load_imbalance_ratio{{{S}}})", "imbalance")),
            series("Predicted against actual TTFT (p90)", "s",
                   *[(q, f"predicted {legend}") for q, legend in
                     quantiles("sluice_router_predicted_ttft_seconds", "worker", W, (0.9,))],
                   *[(q, f"actual {legend}") for q, legend in
                     quantiles("sluice_router_actual_ttft_seconds", "worker", W, (0.9,))]),
            series("TTFT prediction error", "s",
                   *quantiles("sluice_router_ttft_prediction_error_seconds", "", W, (0.5, 0.9))),
        ]),
        ("KV events and the index", [
            series("KV events/s", "short", (_rate("sluice_router_kv_events_total", W, "worker"), "{{worker}}")),
            series("KV event lag", "s", (f"max by (worker) (sluice_router_kv_event_lag_seconds{{{W}}})",
                                         "{{worker}}"),
                   description="Receive time minus the engine's publish time of the last batch."),
            series("Gaps, replays and index resets", "short",
                   (f"sum by (worker) (increase(sluice_router_kv_event_gaps_total{{{W}}}[{RATE}]))", "gaps {{worker}}"),
                   (f"sum by (worker) (increase(sluice_router_kv_event_replays_total{{{W}}}[{RATE}]))",
                    "replays {{worker}}"),
                   (f"sum by (worker, reason) (increase(sluice_router_kv_index_resets_total{{{W}}}[{RATE}]))",
                    "reset ({{reason}}) {{worker}}")),
            series("Index size", "short", (f"max by (worker) (sluice_router_index_blocks{{{W}}})", "{{worker}}")),
            single("Index memory (estimate)", "bytes", f"sum(sluice_router_index_memory_bytes{{{S}}})"),
            single("Shared state in Redis reachable", "bool", f"min(sluice_router_redis_connected{{{S}}})"),
        ]),
    ])


def classic_models() -> Dashboard:
    board = dashboard("sluice-classic-models", "Sluice / Classic models",
                      "Triton-compatible models: Triton's own nv_inference_* panels, plus latency percentiles.",
                      GATEWAY, variable("model", "Model", "nv_inference_request_success"))
    phases = ("request", "queue", "compute_input", "compute_infer", "compute_output")
    success = _rate("nv_inference_request_success", M, "model")
    return with_panels(board, [
        ("Requests (Triton's metrics)", [
            series("Inference requests/s", "reqps", (success, "success {{model}}"),
                   (_rate("nv_inference_request_failure", M, "model, reason"), "failure {{reason}} {{model}}")),
            series("Batch size (inferences per execution)", "short",
                   (f'{_rate("nv_inference_count", M, "model")} / {_rate("nv_inference_exec_count", M, "model")}',
                    "{{model}}")),
            series("Pending requests", "short", (f"sum by (model) (nv_inference_pending_request_count{{{M}}})",
                                                 "{{model}}")),
            series("Average time per request, by phase", "µs",
                   *[(f'{_rate(f"nv_inference_{p}_duration_us", M, "model")} / {success}', f"{p} {{{{model}}}}")
                     for p in phases],
                   description="Triton's cumulative microseconds over its successful requests."),
        ]),
        ("Latency percentiles (Sluice's histograms)", [
            series(f"{p.replace('_', ' ').capitalize()} time", "s",
                   *quantiles(f"sluice_classic_{p}_duration_seconds", "model", M, (0.5, 0.99)), width=8)
            for p in phases
        ]),
    ])


def workers_health() -> Dashboard:
    board = dashboard("sluice-workers-health", "Sluice / Workers and health",
                      "Gateways, LLM workers as the router sees them, in-process engines, keys and quotas.",
                      GATEWAY, variable("worker", "Worker", "sluice_router_worker_healthy"))
    return with_panels(board, [
        ("Gateways", [
            single("Gateways up", "short", f"sum(up{{{S}}})"),
            single("Workers healthy", "short", f"sum(max by (worker) (sluice_router_worker_healthy{{{W}}}))"),
            series("Background task restarts", "short",
                   (f"sum by (task, worker) (increase(sluice_background_task_restarts_total{{{S}}}[{RATE}]))",
                    "{{task}} {{worker}}")),
            series("In-process engine restarts", "short",
                   (f"sum by (model, worker) (increase(sluice_engine_restarts_total{{{S}}}[{RATE}]))", "{{model}}")),
        ]),
        ("LLM workers (the router's view)", [
            series("Healthy (1) and circuit breaker (0 closed, 1 half-open, 2 open)", "short",
                   (f"min by (worker) (sluice_router_worker_healthy{{{W}}})", "healthy {{worker}}"),
                   (f"max by (worker) (sluice_router_worker_breaker_state{{{W}}})", "breaker {{worker}}")),
            series("In flight from the gateways; queued prefill", "short",
                   (f"sum by (worker) (sluice_router_worker_in_flight{{{W}}})", "in flight {{worker}}"),
                   (f"max by (worker) (sluice_router_worker_queued_prefill_tokens{{{W}}})",
                    "queued prefill tokens {{worker}}")),
            series("Running and waiting, as the worker reports", "short",
                   (f"max by (worker) (sluice_router_worker_requests_running{{{W}}})", "running {{worker}}"),
                   (f"max by (worker) (sluice_router_worker_requests_waiting{{{W}}})", "waiting {{worker}}")),
            series("KV-cache usage", "percentunit",
                   (f"max by (worker) (sluice_router_worker_kv_cache_usage_ratio{{{W}}})", "{{worker}}")),
        ]),
        ("In-process engines", [
            series("Running and waiting", "short",
                   (f"sum by (model, worker) (sluice_engine_requests_running{{{S}}})", "running {{model}}"),
                   (f"sum by (model, worker) (sluice_engine_requests_waiting{{{S}}})", "waiting {{model}}")),
            series("Forward passes/s, and the share that batched", "short",
                   (_rate("sluice_engine_steps_total", S, "model"), "steps {{model}}"),
                   (f'{_rate("sluice_engine_batched_steps_total", S, "model")} / '
                    f'{_rate("sluice_engine_steps_total", S, "model")}', "batched share {{model}}")),
        ]),
        ("Keys and quotas", [
            series("Requests by key", "reqps", (_rate("sluice_key_requests_total", S, "key_id"), "{{key_id}}")),
            series("Tokens by key", "short",
                   (_rate("sluice_key_tokens_total", S, "key_id, kind"), "{{kind}} {{key_id}}")),
            series("Quota refusals and auth failures", "reqps",
                   (_rate("sluice_key_rejections_total", S, "key_id, reason"), "{{reason}} {{key_id}}"),
                   (_rate("sluice_auth_failures_total", S, "access"), "auth failure ({{access}})")),
            series("Redis reachable (quotas, routing)", "short",
                   (f"min(sluice_quota_redis_up{{{S}}})", "quotas"),
                   (f"min(sluice_router_redis_connected{{{S}}})", "routing")),
        ]),
    ])


DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "llm-overview": llm_overview,
    "routing-cache": routing_cache,
    "classic-models": classic_models,
    "workers-health": workers_health,
    "vllm-engine": vllm_engine,
}
