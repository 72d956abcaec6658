"""Sluice's Grafana dashboards, as code: `python deploy/grafana/build.py` writes the JSON beside it.

Built with Grafana's own dashboard SDK (grafana-foundation-sdk, Apache-2.0, the build for
Grafana 11.6: schemaVersion 41). Every dashboard picks its Prometheus through a data-source
template variable (`${datasource}`), so it imports as it is: no `__inputs`, nothing to edit.
Then `$namespace` and `$job`, from a series every target the dashboard reads exports (its
anchor), and every query filters on both (`SCOPE`), so that two deployments scraped by one
Prometheus do not add up. Per-model and per-worker variables follow, each narrowed by the ones
before it. All are `label_values` queries, multi-valued with "All".

The JSON files are committed; tests/deploy/test_dashboards.py checks they are what this
script writes, and tests/integration/test_prometheus_dashboards.py runs every query against a
real Prometheus scraping a live gateway (the vLLM engine dashboard's series are checked against
vLLM's source instead: no vLLM runs there).

The routing panels read the cost model's series (sluice_router_predicted_ttft_seconds,
sluice_router_actual_ttft_seconds, sluice_router_ttft_prediction_error_seconds,
sluice_router_load_imbalance_ratio, sluice_router_decision_seconds; docs/routing.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as d
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

HERE = Path(__file__).resolve().parent
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
SCOPE = 'namespace=~"$namespace", job=~"$job"'


def query(expr: str, legend: str = "") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").range()


def series(title: str, unit: str, *queries: tuple[str, str], description: str = "",
           width: int = 12) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).datasource(DS).unit(unit).span(width).height(8)
    if description:
        panel = panel.description(description)
    for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
        panel = panel.with_target(query(expr, legend).ref_id(ref))
    return panel


def single(title: str, unit: str, expr: str, description: str = "", width: int = 6) -> stat.Panel:
    panel = stat.Panel().title(title).datasource(DS).unit(unit).span(width).height(4)
    if description:
        panel = panel.description(description)
    return panel.with_target(query(expr).ref_id("A").instant())


def quantiles(metric: str, by: str, selector: str, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> list[tuple[str, str]]:
    """histogram_quantile over `metric`_bucket, one query per quantile, split by `by`."""
    group = f"le, {by}" if by else "le"
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
             f"p{round(q * 100)}" + (f" {{{{{by}}}}}" if by else "")) for q in qs]


def variable(name: str, label: str, metric: str, scope: str = SCOPE) -> d.QueryVariable:
    """`$name`: the values of the label `name` on `metric`, among the series `scope` selects (the
    variables before it, so that picking a namespace narrows the jobs, and so on)."""
    expr = f"label_values({metric}{{{scope}}}, {name})" if scope else f"label_values({metric}, {name})"
    return (d.QueryVariable(name).label(label).datasource(DS).query(expr).multi(True).include_all(True)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC))


def dashboard(uid: str, title: str, description: str, anchor: str, *variables: d.QueryVariable) -> d.Dashboard:
    """A dashboard with its data-source, `$namespace` and `$job` variables (the values of `anchor`,
    a series every target it reads exports), then `variables`."""
    board = (d.Dashboard(title).uid(uid).description(description).tags(["sluice"]).refresh("30s")
             .time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
             .with_variable(d.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
             .with_variable(variable("namespace", "Namespace", anchor, scope=""))
             .with_variable(variable("job", "Job", anchor, scope='namespace=~"$namespace"')))
    for v in variables:
        board = board.with_variable(v)
    return board


def with_panels(board: d.Dashboard, rows: list[tuple[str, list[object]]]) -> d.Dashboard:
    for title, panels in rows:
        board = board.with_row(d.Row(title))
        for panel in panels:
            board = board.with_panel(panel)  # type: ignore[arg-type]
    return board


def render(board: d.Dashboard) -> str:
    """The dashboard's JSON, with panel ids numbered in order (stable across builds)."""
    data = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    for i, panel in enumerate(data["panels"], start=1):
        panel["id"] = i
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    from dashboards import DASHBOARDS  # the dashboards themselves, beside this file

    check = "--check" in argv
    stale = []
    for name, build in DASHBOARDS.items():
        path = HERE / f"{name}.json"
        text = render(build())
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    for name in stale:
        print(f"{name} is not what build.py writes; run python deploy/grafana/build.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(sys.argv[1:]))
