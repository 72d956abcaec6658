"""Write deploy/k8s/components/monitoring/prometheusrule.yaml from rules.yml (the one source).

`python deploy/prometheus/sync.py`; `--check` exits 1 when the manifest is out of date
(tests/deploy/test_prometheus_rules.py checks the same)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
MANIFEST = HERE.parent / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/prometheus/rules.yml by deploy/prometheus/sync.py: edit that file,
# then run the script. `job` in the rules is the Service name under the ServiceMonitor.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as rules.yml writes them."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                            style="|" if "\n" in s else None))


def manifest() -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "sluice", "labels": {"app.kubernetes.io/name": "sluice"}},
            "spec": {"groups": groups}}
    return HEADER + yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    text = manifest()
    if "--check" in argv:
        if MANIFEST.read_text() != text:
            print(f"{MANIFEST} is out of date: run python deploy/prometheus/sync.py", file=sys.stderr)
            return 1
        return 0
    MANIFEST.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
