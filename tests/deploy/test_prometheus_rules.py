"""deploy/prometheus: the rules pass promtool, the scrape config passes promtool, every
expression parses, and the PrometheusRule of deploy/k8s carries exactly the same groups."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.deploy.validation import DEPLOY, ROOT, build, by_kind

PROM = ROOT / "deploy" / "prometheus"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool comes with `make apt` (prometheus)")


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_rules_and_config_pass_promtool() -> None:
    rules = _promtool("check", "rules", str(PROM / "rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = _promtool("check", "config", str(PROM / "prometheus.yml"))
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    groups = yaml.safe_load((PROM / "rules.yml").read_text())["groups"]
    groups[1]["rules"][0]["expr"] = "up{job=\"sluice-gateway\" == 0"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    assert _promtool("check", "rules", str(path)).returncode != 0


def test_every_expression_parses() -> None:
    for group in yaml.safe_load((PROM / "rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            promql_parser.parse(rule["expr"])
            assert rule.get("alert") is None or {"summary", "description", "runbook"} <= set(rule["annotations"])


def test_the_prometheusrule_carries_the_same_groups() -> None:
    assert subprocess.run([sys.executable, str(PROM / "sync.py"), "--check"], timeout=60).returncode == 0
    rule = by_kind(build(DEPLOY / "overlays" / "gpu-vllm"), "PrometheusRule")[0]
    assert rule["spec"]["groups"] == yaml.safe_load((PROM / "rules.yml").read_text())["groups"]


def test_every_runbook_exists() -> None:
    doc = (ROOT / "docs" / "observability.md").read_text().lower()
    for group in yaml.safe_load((PROM / "rules.yml").read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                anchor = rule["annotations"]["runbook"].partition("#")[2]
                assert f"### {anchor}" in doc, anchor
