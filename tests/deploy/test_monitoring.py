"""Monitoring wiring: the ServiceMonitor selects every Service whose /metrics Prometheus can read
(gateways, vLLM and `sluice worker` workers) and not trtllm-serve's JSON one; and an alert fires
when no gateway target exists at all, run through `promtool test rules`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.pods import overlay_docs, selects
from tests.deploy.validation import OVERLAYS, ROOT, by_kind

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
UNREADABLE = {"trtllm-worker"}  # components whose /metrics is not Prometheus's text format


@pytest.mark.parametrize("name", [o for o in OVERLAYS if o != "cpu-dev"])
def test_the_servicemonitor_selects_every_readable_metrics_endpoint(name: str) -> None:
    docs = overlay_docs(name)
    (monitor,) = by_kind(docs, "ServiceMonitor")
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    scraped = set()
    for service in by_kind(docs, "Service"):
        labels = service["metadata"].get("labels", {})
        if not ports & {p.get("name") for p in service["spec"]["ports"]}:
            continue
        selected = selects(monitor["spec"]["selector"], labels)
        readable = labels.get("app.kubernetes.io/component") not in UNREADABLE
        assert selected == readable, (service["metadata"]["name"], labels)
        if selected:
            scraped.add(labels.get("app.kubernetes.io/component"))
    assert "gateway" in scraped
    if name.endswith("vllm"):
        assert "vllm-worker" in scraped


def _promtool_test(tmp_path: Path, series: list[dict[str, str]], fires: bool) -> subprocess.CompletedProcess[str]:
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "SluiceGatewayAbsent")
    expected = {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
    alert = {"eval_time": "10m", "alertname": "SluiceGatewayAbsent", "exp_alerts": [expected] if fires else []}
    spec = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [alert]}]}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool comes with `make apt` (prometheus)")
def test_an_alert_fires_when_no_gateway_target_exists(tmp_path: Path) -> None:
    gone = _promtool_test(tmp_path, [{"series": 'up{job="sluice-workers", instance="w:8100"}', "values": "1x15"}],
                          fires=True)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    present = [{"series": 'up{job="sluice-gateway", instance="g:8000"}', "values": "1x15"}]
    assert _promtool_test(tmp_path, present, fires=False).returncode == 0
    wrong = _promtool_test(tmp_path, present, fires=True)  # the check can fail
    assert wrong.returncode != 0 and "SluiceGatewayAbsent" in wrong.stdout + wrong.stderr


def test_every_target_outside_kubernetes_has_a_namespace(tmp_path: Path) -> None:
    """The dashboards filter on `namespace`, which Kubernetes discovery gives every target;
    deploy/prometheus/prometheus.yml must give its static targets one too, and the Prometheus
    test's harness, which swaps the targets for its own, must keep it."""
    from tests.integration.prometheus_support import PrometheusServer

    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            assert static.get("labels", {}).get("namespace"), (job["job_name"], static)
    targets = {job["job_name"]: ["127.0.0.1:1"] for job in config["scrape_configs"]}
    written = yaml.safe_load(PrometheusServer(tmp_path, targets).config_path.read_text())
    for job in written["scrape_configs"]:
        assert job["static_configs"] == [{"targets": ["127.0.0.1:1"], "labels": {"namespace": "sluice"}}]
