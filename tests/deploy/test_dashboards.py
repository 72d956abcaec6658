"""deploy/grafana: the committed dashboards are what build.py writes, they import into Grafana as
they are (uid, schemaVersion, the data-source variable, no __inputs), and every query parses
as PromQL. That every query returns data from a real Prometheus is
tests/integration/test_prometheus_dashboards.py."""

from __future__ import annotations

import importlib.util
import json
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


def regex_matchers(expr: str) -> list[dict[str, str]]:
    """Each series selector of `expr` as {label: value} of its `=~` matchers, the variables left as
    `$name` (replaced by a placeholder to parse, then put back)."""
    placeholders = VARIABLES.sub(lambda m: f"VAR_{m.group(1) or m.group(2)}", expr.replace("$__rate_interval", "1m"))
    parsed = promql_parser.parse(placeholders)
    found: list[dict[str, str]] = []
    promql_parser.walk(parsed, lambda n: found.append({
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
