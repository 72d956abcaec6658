"""A real Prometheus (Debian's `prometheus` binary) for tests, and the traffic the dashboards need.

`PrometheusServer` runs deploy/prometheus/prometheus.yml with its targets replaced (their labels,
`namespace` among them, kept) and its intervals shortened, on a free loopback port, with a
throw-away TSDB. `query()` is the HTTP API's instant query.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import yaml

from tests.servers import ROOT, free_port

HAVE_PROMETHEUS = shutil.which("prometheus") is not None
DEPLOY = ROOT / "deploy" / "prometheus"
COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
# Grafana's `label_values(metric, label)` or `label_values(metric{matchers}, label)`: a metric name
# may hold colons (vLLM's `vllm:*`); the matchers name the variables before it.
LABEL_VALUES = re.compile(r"label_values\(([a-zA-Z_:][\w:]*)(\{[^{}]*\})?,\s*(\w+)\)")


class PrometheusServer:
    def __init__(self, tmp: Path, targets: dict[str, list[str]], interval_s: float = 1.0) -> None:
        self.port = free_port()
        self.tmp = tmp
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s",
                            "scrape_timeout": f"{interval_s:g}s"}
        config["rule_files"] = [str(DEPLOY / f) for f in config["rule_files"]]
        for job in config["scrape_configs"]:
            job.pop("scrape_timeout", None)
            job["static_configs"] = [{**job["static_configs"][0], "targets": targets[job["job_name"]]}]
        self.config_path = tmp / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        log = (self.tmp / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config_path}", f"--storage.tsdb.path={self.tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT)
        for _ in range(300):  # bounded: ready within 30 s
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.tmp / 'prometheus.log').read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("prometheus not ready after 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + "/api/v1/" + path, params=params, timeout=30)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) `expr` evaluates to now."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def label_values(self, definition: str, chosen: dict[str, str] | None = None) -> list[str]:
        """A Grafana `label_values` variable's values, as Grafana asks Prometheus for them; `chosen`
        holds the values of the variables before it (as `grafana_regex` writes them)."""
        label, match = label_values_request(definition, chosen or {})
        return sorted(v for v in self.api(f"label/{label}/values", **{"match[]": match}) if v)


def label_values_request(definition: str, chosen: dict[str, str]) -> tuple[str, str]:
    """(label, series selector) of a `label_values` definition, its `$variables` replaced by `chosen`."""
    m = LABEL_VALUES.fullmatch(definition)
    assert m, definition
    selector = re.sub(r"\$(\w+)", lambda v: chosen[v.group(1)], m.group(2) or "")
    return m.group(3), m.group(1) + selector


def _constant(expr: Any) -> bool:
    """True when `expr` holds no series selector (a threshold such as 0.05 or (14.4 * 0.01))."""
    found: list[Any] = []
    promql_parser.walk(expr, lambda node: found.append(node) if isinstance(
        node, promql_parser.VectorSelector | promql_parser.MatrixSelector) else None, None)
    return not found


def without_thresholds(expr: str) -> str:
    """An alert condition with its threshold comparisons removed: `a > 0.05 and b == 0` becomes
    `a and b`, so that "returns data" means the series it watches exist."""
    def strip(node: Any) -> Any:
        if isinstance(node, promql_parser.BinaryExpr) and str(node.op) in COMPARISONS:
            if _constant(node.rhs):
                return node.lhs
            if _constant(node.lhs):
                return node.rhs
        return None

    return str(promql_parser.transform(promql_parser.parse(expr), None, strip))


def grafana_regex(values: list[str]) -> str:
    """A multi-valued variable with "All" selected, as Grafana writes it into a Prometheus query."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return "(" + "|".join(escaped) + ")" if len(escaped) > 1 else (escaped[0] if escaped else "")
