"""Who may reach each port of each pod, worked out from an overlay's NetworkPolicies as a CNI
enforces them: ingress is denied by default in the namespace; anyone reaches the gateway's API;
only gateways reach Redis and the workers' KV-event ports; Ray's and sshd's ports (MPI) admit
their own group's pods and no others; and no port a pod listens on is left unreachable."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.pods import LWS_NAME, overlay_docs, pod_labels, selects, templates
from tests.deploy.validation import OVERLAYS, by_kind

Obj = dict[str, Any]
ANYONE = "*"
SCRAPER = "prometheus (any namespace)"


def _sources(rule: Obj, pods: dict[str, dict[str, str]]) -> set[str]:
    """The pods (by owner) a rule admits; ANYONE without `from`; SCRAPER for the monitoring peer."""
    if "from" not in rule:
        return {ANYONE}
    out: set[str] = set()
    for peer in rule["from"]:
        if "namespaceSelector" in peer:
            assert peer.get("podSelector") == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}, peer
            out.add(SCRAPER)
        elif "podSelector" in peer:
            out |= {owner for owner, labels in pods.items() if selects(peer["podSelector"], labels)}
        else:
            raise AssertionError(f"unexpected peer {peer}")
    return out


def admitted(docs: list[Obj], owner: str, port: int, port_name: str) -> set[str]:
    pods = pod_labels(docs)
    found: set[str] = set()
    for policy in by_kind(docs, "NetworkPolicy"):
        if not selects(policy["spec"]["podSelector"], pods[owner]):
            continue
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is None or any(p["port"] in (port, port_name) for p in ports):
                found |= _sources(rule, pods)
    return found


@pytest.mark.parametrize("name", OVERLAYS)
def test_ingress_is_denied_by_default(name: str) -> None:
    docs = overlay_docs(name)
    deny = [p for p in by_kind(docs, "NetworkPolicy") if p["spec"]["podSelector"] == {}]
    assert deny and all(p["spec"]["policyTypes"] == ["Ingress"] and not p["spec"].get("ingress") for p in deny)


@pytest.mark.parametrize("name", OVERLAYS)
def test_each_port_admits_only_whom_it_serves(name: str) -> None:
    docs = overlay_docs(name)
    pods = pod_labels(docs)
    monitored = bool(by_kind(docs, "ServiceMonitor"))
    checked = set()
    for owner, template in templates(docs).items():
        lws = pods[owner].get(LWS_NAME)
        group = {o for o, labels in pods.items() if lws and labels.get(LWS_NAME) == lws}
        for container in template["spec"]["containers"]:
            for port in container.get("ports", []):
                who = admitted(docs, owner, port["containerPort"], port.get("name", ""))
                where = f"{owner}:{port.get('name')}"
                assert who, f"{where} listens, but no policy admits anyone"
                if owner == "sluice-gateway":
                    expected = {ANYONE}
                elif owner == "sluice-redis" or port.get("name", "").startswith("kv-"):
                    expected = {"sluice-gateway"}
                elif port.get("name") in ("ray", "ssh"):  # Ray's head, MPI's sshd: the group's own pods
                    expected = group
                else:  # a worker's HTTP port: the gateways, the scraper, and its group (NCCL, Ray)
                    expected = {"sluice-gateway"} | ({SCRAPER} if monitored else set()) | group
                assert who == expected, (where, who)
                checked.add(port.get("name"))
    assert {"http", "redis"} <= checked
    if name == "multinode-vllm":
        assert "ray" in checked
    if name == "multinode-trtllm":
        assert "ssh" in checked
