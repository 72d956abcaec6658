"""deploy/k8s: every overlay builds with kustomize, and everything it outputs validates
(built-in kinds with kubernetes-validate for Kubernetes 1.33, strict; LeaderWorkerSet,
ServiceMonitor and PrometheusRule against their published CRD schemas). Plus the facts the
manifests must agree on with the code: settings names, discovery selectors, probes, keys."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from gateway.discovery.spec import parse_discovery
from gateway.settings import Settings
from tests.deploy.validation import DEPLOY, OVERLAYS, ROOT, build, by_kind, validate
from tests.standins.k8s_api_standin import selector_matches


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, build(DEPLOY / "overlays" / request.param)


def test_every_object_of_every_overlay_validates(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap",
            "ServiceAccount", "Role", "RoleBinding"} <= kinds
    how = {f"{d['kind']}/{d['metadata']['name']}": validate(d) for d in docs}
    assert all(d["metadata"].get("namespace") == "sluice" for d in docs if d["kind"] != "Namespace")
    if name.startswith("multinode"):
        assert how[f"LeaderWorkerSet/{name.split('-')[1]}-llama-70b"] == "crd"
    if name != "cpu-dev":
        assert how["ServiceMonitor/sluice"] == how["PrometheusRule/sluice"] == "crd"


def test_the_base_builds_on_its_own() -> None:
    docs = build(DEPLOY / "base")
    assert {f"{d['kind']}/{d['metadata']['name']}" for d in docs} >= {
        "Deployment/sluice-gateway", "Service/sluice-gateway", "Deployment/sluice-redis", "Service/sluice-redis"}
    for doc in docs:
        validate(doc)


def test_validation_refuses_what_the_api_server_would(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """The validators are not rubber stamps: a typo'd field fails, for built-in and custom kinds."""
    _, docs = overlay
    deployment = json.loads(json.dumps(by_kind(docs, "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        validate(deployment)
    for custom in [d for d in docs if d["kind"] in ("LeaderWorkerSet", "ServiceMonitor")]:
        bad = json.loads(json.dumps(custom))
        bad["spec"]["replica"] = 2
        with pytest.raises(jsonschema.ValidationError):
            validate(bad)
    with pytest.raises(SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "x"}})


def test_gateway_probes_settings_and_keys(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay
    gateway = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sluice-gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] != "/health"  # /health is 503 while models load
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8000, "grpc": 8001}
    service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "sluice-gateway")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 8000, "grpc": 8001}
    assert {"secretRef": {"name": "sluice-keys"}} in container["envFrom"]
    settings = _settings_configmap(docs, container)
    fields = {f"SLUICE_{name.upper()}" for name in Settings.model_fields}
    assert set(settings) <= fields, set(settings) - fields  # a misspelt name would be ignored silently
    Settings(**{k.removeprefix("SLUICE_").lower(): _env_value(v) for k, v in settings.items()})
    assert not by_kind(docs, "Secret")  # keys are never in the manifests


def test_every_worker_service_is_discovered(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """Each Service of workers carries labels some discovery spec selects (the EndpointSlice
    controller copies a Service's labels onto its slices), with the port the spec names."""
    _, docs = overlay
    container = next(d for d in by_kind(docs, "Deployment")
                     if d["metadata"]["name"] == "sluice-gateway")["spec"]["template"]["spec"]["containers"][0]
    specs = [parse_discovery(s) for s in json.loads(_settings_configmap(docs, container)["SLUICE_K8S_DISCOVERY"])]
    workers = [s for s in by_kind(docs, "Service") if s["metadata"]["labels"].get(
        "app.kubernetes.io/component", "").endswith("-worker")]
    assert workers
    for service in workers:
        labels = service["metadata"]["labels"]
        spec = next((s for s in specs if selector_matches(s.selector, labels)), None)
        assert spec is not None, f"no discovery spec selects {service['metadata']['name']}"
        assert spec.port in {p["name"] for p in service["spec"]["ports"]}
        assert spec.engine == labels["app.kubernetes.io/component"].removesuffix("-worker")


def test_workers_name_themselves_after_their_pod(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """Self-registration and discovery must agree on a worker's name (the pod's) and URL (its IP)."""
    name, docs = overlay
    checked = 0
    for deployment in by_kind(docs, "Deployment"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        cmd = container.get("command", [])
        if cmd[:2] != ["sluice", "worker"]:
            continue
        checked += 1
        assert cmd[cmd.index("--name") + 1] == "$(POD_NAME)" and cmd[cmd.index("--advertise-host") + 1] == "$(POD_IP)"
        env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
        assert env["POD_NAME"]["fieldRef"]["fieldPath"] == "metadata.name"
        # A worker pod holds the registration key (the `workers` scope) and never an admin key.
        assert env["SLUICE_REGISTRATION_KEY"]["secretKeyRef"] == {"name": "sluice-registration",
                                                                  "key": "SLUICE_REGISTRATION_KEY"}
        assert not any("ADMIN" in e or e.startswith("SLUICE_API") for e in env)
        assert all(ref.get("secretRef", {}).get("name") != "sluice-keys" for ref in container.get("envFrom", []))
    assert checked or name.startswith("multinode")  # multi-node leaders: tests/engines/launchers/test_launch_files.py


def test_grafana_generator_lists_every_dashboard() -> None:
    grafana = ROOT / "deploy" / "grafana"
    generator = yaml.safe_load((grafana / "kustomization.yaml").read_text())["configMapGenerator"][0]
    listed = {Path(f.split("=")[-1]).name for f in generator.get("files") or []}
    assert listed == {p.name for p in grafana.glob("*.json")}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool comes with `make apt` (prometheus)")
def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    docs = build(DEPLOY / "overlays" / "gpu-vllm")
    rule = next(d for d in by_kind(docs, "PrometheusRule"))
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    groups = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())["groups"]
    assert f"{sum(len(g['rules']) for g in groups)} rules found" in proc.stdout


def test_kubectl_kustomize_agrees_when_present() -> None:
    """A second kustomize (the one inside kubectl), when the machine has one, builds the same objects."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here")
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"Kustomize Version: v(\d+)", version)
    if not match or int(match.group(1)) < 5:
        pytest.skip(f"kubectl's kustomize is older than v5: {version.strip()}")
    for name in OVERLAYS:
        out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "overlays" / name)], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        theirs = sorted(json.dumps(d, sort_keys=True) for d in yaml.safe_load_all(out) if d)
        assert theirs == sorted(json.dumps(d, sort_keys=True) for d in build(DEPLOY / "overlays" / name)), name


def _settings_configmap(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    name = next(e["configMapRef"]["name"] for e in container["envFrom"] if "configMapRef" in e)
    return next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name)["data"]


def _env_value(text: str) -> Any:
    """What pydantic-settings makes of an environment value: JSON for complex fields."""
    return json.loads(text) if text.startswith(("[", "{")) else text


def test_workers_bind_the_pod_ip_and_share_the_worker_key(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """Every worker binds its pod's IP (never 0.0.0.0) and requires the key from the Secret
    `sluice-worker-key`, which the gateway reads too (it sends it to every worker)."""
    _, docs = overlay
    worker_key = {"secretKeyRef": {"name": "sluice-worker-key", "key": "SLUICE_WORKER_KEY"}}
    gateway = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sluice-gateway")
    gateway_container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert {"secretRef": {"name": "sluice-worker-key"}} in gateway_container["envFrom"]
    containers = [d["spec"]["template"]["spec"]["containers"][0] for d in by_kind(docs, "Deployment")
                  if d["spec"]["template"]["spec"]["containers"][0].get("command", [])[:2] == ["sluice", "worker"]]
    for lws in by_kind(docs, "LeaderWorkerSet"):
        template = lws["spec"]["leaderWorkerTemplate"]
        containers.append((template.get("leaderTemplate") or template["workerTemplate"])["spec"]["containers"][0])
    assert containers
    for container in containers:
        env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
        assert env["SLUICE_WORKER_KEY"] == worker_key
        cmd = container["command"]
        if cmd[:2] == ["sluice", "worker"]:
            assert cmd[cmd.index("--host") + 1] == "$(POD_IP)"
            assert env["POD_IP"]["fieldRef"]["fieldPath"] == "status.podIP"
        else:  # a LeaderWorkerSet leader runs `sluice worker` from its script, on the pod IP LWS gives it
            script = next(d for d in docs if d["kind"] == "ConfigMap" and "leader.sh" in d.get("data", {}))
            assert '--host "$HOST_IP"' in script["data"]["leader.sh"] and "0.0.0.0" not in script["data"]["leader.sh"]
            assert env["SLUICE_ADVERTISE_HOST"]["fieldRef"]["fieldPath"] == "status.podIP"


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels, matchExpressions with In/NotIn/Exists) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present = e["key"] in labels
        ok = {"In": present and labels[e["key"]] in e["values"], "NotIn": not present or labels[e["key"]] not in
              e["values"], "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def _pod_labels(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Every pod template's labels, by owner (Deployments; LeaderWorkerSet leaders and workers,
    with the name label the LWS controller adds)."""
    out = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in by_kind(docs, "Deployment")}
    for lws in by_kind(docs, "LeaderWorkerSet"):
        for role, template in lws["spec"]["leaderWorkerTemplate"].items():
            if role.endswith("Template"):
                name = lws["metadata"]["name"]
                out[f"{name}/{role}"] = {**template["metadata"]["labels"], "leaderworkerset.sigs.k8s.io/name": name}
    return out


def test_only_the_gateway_reaches_workers_and_redis(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """The NetworkPolicies select every worker pod and Redis, and admit to the workers' HTTP and
    KV-event ports (8100, 9100, 9101) and to Redis only gateway pods; the scraper (monitoring) gets
    8100 alone, and a LeaderWorkerSet's pods reach only their own group's."""
    _, docs = overlay
    pods = _pod_labels(docs)
    gateway = pods["sluice-gateway"]
    workers = {k: v for k, v in pods.items() if v.get("app.kubernetes.io/component", "").endswith("-worker")}
    assert workers and gateway.get("app.kubernetes.io/component") == "gateway"
    policies = by_kind(docs, "NetworkPolicy")
    for target, ports in [*((w, {8100, 9100, 9101}) for w in workers), ("sluice-redis", {6379})]:
        selecting = [p for p in policies if _selects(p["spec"]["podSelector"], pods[target])]
        assert any(p["metadata"]["name"] in ("sluice-workers", "sluice-redis") for p in selecting), target
        for policy in selecting:
            assert policy["spec"]["policyTypes"] == ["Ingress"]
            for rule in policy["spec"].get("ingress", []):  # none: sluice-default-deny
                admitted = {k for k, v in pods.items() for peer in rule["from"] if "podSelector" in peer
                            and "namespaceSelector" not in peer and _selects(peer["podSelector"], v)}
                rule_ports = {p["port"] for p in rule.get("ports", [])}
                if admitted == {"sluice-gateway"}:
                    assert rule_ports == ports, (target, policy["metadata"]["name"])
                elif "namespaceSelector" in rule["from"][0]:  # the Prometheus scraper: /metrics only
                    assert rule["from"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
                    assert rule_ports == {8100} and target in workers
                else:  # a LeaderWorkerSet's group: its own pods, no one else's
                    group = pods[target]["leaderworkerset.sigs.k8s.io/name"]
                    assert admitted == {k for k in workers if k.startswith(f"{group}/")}, (target, admitted)


def test_redis_requires_the_password_the_gateway_reads(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    """Redis runs with `requirepass` from the Secret sluice-redis-password, never on its command
    line, and the gateway reads SLUICE_REDIS_PASSWORD from the same Secret key."""
    _, docs = overlay
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
                   for d in by_kind(docs, "Deployment")}
    ref = {"secretKeyRef": {"name": "sluice-redis-password", "key": "SLUICE_REDIS_PASSWORD"}}
    redis_env = {e["name"]: e.get("valueFrom") for e in deployments["sluice-redis"]["env"]}
    script = deployments["sluice-redis"]["command"][-1]
    assert redis_env["REDISCLI_AUTH"] == ref and "requirepass" in script and "$REDISCLI_AUTH" in script
    assert "redis-server /run/redis/redis.conf" in script and "--requirepass" not in script
    assert {e["name"]: e.get("valueFrom") for e in deployments["sluice-gateway"]["env"]}["SLUICE_REDIS_PASSWORD"] == ref
