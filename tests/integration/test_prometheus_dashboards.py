"""The dashboards and alerts against a real Prometheus scraping a live gateway (docs/observability.md).

One stack for the module: redis-server; `sluice serve` with classic models, the embedding model,
a tiny in-process LLM, API keys, Redis and `--metrics-port`; a sim worker registered with it;
Debian's `prometheus` running deploy/prometheus/prometheus.yml (targets swapped for these, 1 s
intervals, rules.yml loaded). LLM, embedding and classic traffic runs while it scrapes. Then:
every `sluice_*` family is documented with HELP and a unit; every dashboard query and every
rule parses and returns data (but the vLLM engine dashboard's: no vLLM runs here, see
CHECKED_ELSEWHERE).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import promql_parser
import pytest
import yaml

from tests.deploy.test_dashboards import dashboards, panel_queries, with_variables
from tests.integration.kserve_support import CACHE, REPO_SRC
from tests.integration.prometheus_support import HAVE_PROMETHEUS, PrometheusServer, grafana_regex, without_thresholds
from tests.integration.traffic import Traffic
from tests.integration.vllm_support import free_port_pair, stop_process, tiny_llama_dir, wait_healthy
from tests.redis_server import HAVE_REDIS, RedisServer
from tests.servers import ROOT, Server, free_port, start_server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not (HAVE_PROMETHEUS and HAVE_REDIS), reason="needs prometheus and redis-server "
                                 "(scripts/ensure_apt.sh installs both)")]

# Router series queried by the dashboards before a change adds them (none now: the cost model's
# five landed). A name here may be absent from the live gateway; REMOVE it when it lands.
PENDING_ROUTER_SERIES: frozenset[str] = frozenset()
# Dashboards over series this stack has no exporter of, each with where they are checked instead.
CHECKED_ELSEWHERE = {
    "vllm-engine": "reads vLLM's own vllm:* series, which the sim worker does not export; every series "
                   "it queries is checked against the installed vLLM's source in tests/deploy/test_dashboards.py",
}
UNITS = ("seconds", "bytes", "tokens", "blocks", "ratio")
DOC = ROOT / "docs" / "observability.md"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
LOCAL_LLM, SIM_LLM = "tiny-local", "tiny-llama"
MAIN_KEY, TIGHT_KEY = "sk-observe-main-0123456789", "sk-observe-tight-0123456789"


@dataclass
class Stack:
    gateway: Server
    metrics_port: int
    prometheus: PrometheusServer
    traffic: Traffic


def _repository(tmp: Path) -> Path:
    from model_repository.classic_build import build_all

    repo = tmp / "repo"
    repo.mkdir()
    for name in ("digits_onnx", "digits_preprocess", "digits_postprocess", "digits_ensemble", "breast_cancer_gb",
                 "all-minilm-l6-v2"):
        shutil.copytree(REPO_SRC / name, repo / name, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    build_all(repo, CACHE)
    (repo / LOCAL_LLM).mkdir()
    (repo / LOCAL_LLM / "config.pbtxt").write_text(
        f'name: "{LOCAL_LLM}"\nbackend: "llm"\nmax_batch_size: 0\n'
        f'parameters {{ key: "weights" value {{ string_value: "{tiny_llama_dir()}" }} }}\n'
        'parameters { key: "max_batch_size" value { string_value: "8" } }\n')
    return repo


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("observe")
    keys = tmp / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"id": "main", "key": MAIN_KEY}, {"id": "tight", "key": TIGHT_KEY, "rpm": 1}]))
    redis = RedisServer().start()
    metrics_port = free_port()
    gateway = start_server(["--model-repository", str(_repository(tmp)), "--redis-url", redis.url,
                            "--metrics-port", str(metrics_port), "--api-keys-file", str(keys)],
                           tmp / "gateway.log")
    port, kv_port = free_port_pair(), free_port_pair()
    sim = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "worker", "--engine", "sim", "--model", str(tiny_llama_dir()),
         "--served-model-name", SIM_LLM, "--port", str(port), "--kv-events-port", str(kv_port), "--name", "sim-0",
         "--block-size", "16", "--profile", "base_s=0.002,decode_seq_s=0.0005", "--gateway", gateway.url],
        cwd=ROOT, start_new_session=True)
    prometheus = PrometheusServer(tmp, {"sluice-gateway": [f"127.0.0.1:{metrics_port}"],
                                        "sluice-workers": [f"127.0.0.1:{port}"]})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", sim)
        traffic = Traffic(gateway.url, MAIN_KEY, TIGHT_KEY, LOCAL_LLM, SIM_LLM, "sim-0")
        traffic.wait_for_models()
        prometheus.start()
        # SLUICE_OBSERVE_TRAFFIC_S: a longer run gives the rendered picture more history (the README's).
        traffic.run(seconds=float(os.environ.get("SLUICE_OBSERVE_TRAFFIC_S", "12")))
        _wait_scraped(prometheus)
        yield Stack(gateway, metrics_port, prometheus, traffic)
    finally:
        prometheus.stop()
        stop_process(sim)
        gateway.stop()
        redis.kill()


def _wait_scraped(prometheus: PrometheusServer) -> None:
    """Until both targets were scraped a few times after the traffic, and the rules evaluated."""
    for _ in range(300):  # bounded: 30 s
        up = prometheus.query('count_over_time(up{job=~"sluice-.*"}[20s]) >= 5')
        if len(up) == 2 and prometheus.query("sluice:ttft_slow_ratio:rate5m"):
            return
        time.sleep(0.1)
    raise AssertionError(f"targets not scraped: {prometheus.api('targets')}")


# -- metric families ------------------------------------------------------------------------
def _documented() -> dict[str, tuple[str, str]]:
    """name -> (type, unit) from the tables of docs/observability.md."""
    out = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `(sluice_\w+)` \| (\w+) \|[^|]*\| (\w+) \|", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def _families(text: str) -> dict[str, tuple[str, str]]:
    """name -> (type, HELP) of each family in Prometheus text exposition, as exposed."""
    helps = dict(re.findall(r"^# HELP (\S+) ?(.*)$", text, re.M))
    return {name: (kind, helps.get(name, "")) for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)}


def test_every_family_has_help_and_a_unit(stack: Stack) -> None:
    text = httpx.get(stack.gateway.url + "/metrics", timeout=10).text
    families = _families(text)
    documented = _documented()
    assert set(documented) >= PENDING_ROUTER_SERIES
    seen = set()
    for exposed, (kind, help_text) in families.items():
        if exposed.startswith("nv_inference_"):
            continue  # Triton's names and units, kept for Triton's dashboards (docs/observability.md)
        if exposed.startswith(("process_", "python_")):
            continue  # prometheus_client's standard process and GC collectors, under their usual names
        if exposed.endswith("_created") and kind == "gauge":
            continue  # prometheus_client's creation timestamp of a counter or histogram family
        assert exposed.startswith("sluice_"), exposed
        assert help_text.strip(), f"{exposed} has no HELP"
        assert kind != "counter" or exposed.endswith("_total"), exposed
        assert exposed in documented, f"{exposed} is not in docs/observability.md"
        doc_kind, unit = documented[exposed]
        assert doc_kind == kind, (exposed, kind, doc_kind)
        name = exposed.removesuffix("_total")  # a counter's unit comes before _total
        if unit in UNITS:
            assert name.endswith("_" + unit), f"{name}: unit {unit} but no _{unit} suffix"
        else:
            assert unit == "1" and kind in ("counter", "gauge"), f"{name}: a {kind} needs a unit"
            assert not name.endswith(tuple("_" + u for u in UNITS)), f"{name}: documented as unitless"
        seen.add(exposed)
    missing = set(documented) - seen - PENDING_ROUTER_SERIES
    assert not missing, f"documented but not exported by the live gateway: {sorted(missing)}"
    assert {"nv_inference_request_failure", "nv_inference_request_success"} <= set(families)


def test_the_metrics_port_serves_the_same_registry(stack: Stack) -> None:
    ours = httpx.get(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10)
    assert ours.status_code == 200 and ours.headers["content-type"].startswith("text/plain")
    assert set(_families(ours.text)) == set(_families(httpx.get(stack.gateway.url + "/metrics", timeout=10).text))
    assert httpx.get(f"http://127.0.0.1:{stack.metrics_port}/v1/models", timeout=10).status_code == 404
    assert httpx.post(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10).status_code == 405


# -- queries --------------------------------------------------------------------------------
def _series_names(expr: str) -> set[str]:
    names: set[str] = set()
    promql_parser.walk(promql_parser.parse(expr), lambda n: names.add(n.name) if isinstance(
        n, promql_parser.VectorSelector) and n.name else None, None)
    return names


def _pending_and_absent(prometheus: PrometheusServer, expr: str) -> bool:
    """True when `expr` reads one of the pending router series and Prometheus has none of it."""
    for name in _series_names(expr):
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        if family in PENDING_ROUTER_SERIES and not prometheus.query(f"count({{__name__=~'{family}(_bucket)?'}})"):
            return True
    return False


def _check(prometheus: PrometheusServer, where: str, expr: str) -> str | None:
    """None when `expr` parses and returns data (or reads only a pending series); else why not."""
    try:
        promql_parser.parse(expr)
    except ValueError as e:
        return f"{where}: does not parse: {e}: {expr}"
    if prometheus.query(expr) or _pending_and_absent(prometheus, expr):
        return None
    return f"{where}: no data: {expr}"


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_dashboard_query_returns_data(stack: Stack, name: str) -> None:
    if name in CHECKED_ELSEWHERE:
        pytest.skip(CHECKED_ELSEWHERE[name])
    board = dashboards()[name]
    values = {}
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            found = stack.prometheus.label_values(v["query"], values)  # narrowed by the variables before it
            assert found, f"variable {v['name']}: {v['query']} has no values"
            values[v["name"]] = grafana_regex(found)
    failures = [f for title, expr in panel_queries(board)
                if (f := _check(stack.prometheus, f"{name} / {title}", with_variables(expr, values)))]
    assert not failures, "\n".join(failures)


def test_every_rule_is_healthy_and_returns_data(stack: Stack) -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    loaded = {r["name"]: r for g in stack.prometheus.api("rules")["groups"] for r in g["rules"]}
    failures = []
    for rule in (r for g in groups for r in g["rules"]):
        name = rule.get("alert") or rule["record"]
        assert loaded[name]["health"] == "ok", (name, loaded[name].get("lastError"))
        # A recording rule by its name (Prometheus evaluated it); an alert by its condition
        # without thresholds: the series it watches exist and join as written.
        expr = rule["record"] if "record" in rule else without_thresholds(rule["expr"])
        failures.append(_check(stack.prometheus, name, expr))
    assert not [f for f in failures if f], "\n".join(f for f in failures if f)


def test_the_checks_can_fail(stack: Stack) -> None:
    """A misspelt series returns no data, and a broken expression does not parse."""
    assert _check(stack.prometheus, "x", 'sum(rate(sluice_request_total{model=~"(tiny-local)"}[1m]))')
    assert _check(stack.prometheus, "x", "sum(rate(sluice_requests_total[1m])")
    assert without_thresholds("max(sluice_router_worker_healthy) == 0") == "max(sluice_router_worker_healthy{})"
    assert not _pending_and_absent(stack.prometheus, "sluice_router_index_memory_bytes")


def test_render_the_llm_overview(stack: Stack, tmp_path: Path) -> None:
    """The README's picture: the LLM overview's panels drawn from Prometheus's answers."""
    out = Path(os.environ.get("SLUICE_TEST_ARTIFACTS", ROOT / "tests" / "artifacts")) / "dashboards"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "llm-overview.png"
    minutes = max(1.0, float(os.environ.get("SLUICE_OBSERVE_TRAFFIC_S", "12")) / 60 + 0.3)
    proc = subprocess.run([sys.executable, str(ROOT / "deploy" / "grafana" / "render.py"),
                           "--prometheus", stack.prometheus.url, "--dashboard",
                           str(ROOT / "deploy" / "grafana" / "llm-overview.json"), "--minutes", str(minutes),
                           "--out", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert path.stat().st_size > 20_000
    summary = json.loads(proc.stdout)
    assert summary["panels"] >= 10 and summary["empty"] == []
