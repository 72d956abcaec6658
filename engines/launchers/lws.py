"""The Kubernetes objects of a multi-node launch: the node scripts' ConfigMap, the
LeaderWorkerSet (`leaderworkerset.x-k8s.io/v1`), the leaders' Service and a NetworkPolicy
that lets the group's pods reach each other.

One LWS group is one engine instance of `nodes` pods: pod 0 (the leader) runs
`leader.sh`, pods 1..N-1 run `worker.sh`. `RecreateGroupOnPodRestart`, because a Ray
cluster or an MPI world does not survive losing a member. The Service selects only
leaders (`worker-index: "0"`) and carries the label the gateway's EndpointSlice
discovery selects on; the EndpointSlice controller copies a Service's labels onto
its slices.

Cluster facts the manifest assumes, named so an operator can change them:
the Secret `sluice-registration` (key `SLUICE_REGISTRATION_KEY`: the gateway's registration
key, which opens worker registration and nothing else), the PersistentVolumeClaim
`sluice-models` mounted read-only at /models, the Secret `sluice-worker-key` (key
`SLUICE_WORKER_KEY`: the key the leader's HTTP server requires and the gateway sends), and for TensorRT-LLM the Secret
`sluice-mpi-ssh` (an SSH key pair and its authorized_keys) at /root/.ssh.
"""

from __future__ import annotations

from typing import Any

import yaml

from engines.launchers.plan import COMPONENT_LABEL, RAY_PORT, SSH_PORT, WORKER_PORT, LaunchPlan
from engines.launchers.scripts import scripts_for

Obj = dict[str, Any]
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
SCRIPTS_DIR = "/opt/sluice-launch"
_STARTUP_PERIOD_S, _STARTUP_TRIES = 10, 360  # an hour for weights to load on every rank


def manifests_for(plan: LaunchPlan) -> list[Obj]:
    """ConfigMap, LeaderWorkerSet, Service and the group's NetworkPolicy, in apply order."""
    return [_scripts_configmap(plan), _leaderworkerset(plan), _leader_service(plan), _peer_policy(plan)]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the scripts) as literal blocks, so the manifest reads like the files;
    no anchors, which some tools that read manifests do not resolve."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[Obj]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def _labels(plan: LaunchPlan) -> dict[str, str]:
    return {"app.kubernetes.io/name": plan.name, "app.kubernetes.io/part-of": "sluice",
            COMPONENT_LABEL: plan.component}


def _scripts_configmap(plan: LaunchPlan) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{plan.name}-launch", "labels": _labels(plan)}, "data": scripts_for(plan)}


def _leaderworkerset(plan: LaunchPlan) -> Obj:
    template: Obj = {"size": plan.layout.nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    if plan.layout.nodes > 1:
        template["leaderTemplate"] = _pod_template(plan, "leader")
        template["workerTemplate"] = _pod_template(plan, "worker")
    else:  # without a leaderTemplate, LWS builds the (only) pod from the workerTemplate
        template["workerTemplate"] = _pod_template(plan, "leader")
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {"name": plan.name, "labels": _labels(plan)},
            "spec": {"replicas": 1, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template}}


def _leader_service(plan: LaunchPlan) -> Obj:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{plan.name}-leader", "labels": _labels(plan)},
            "spec": {"selector": {LWS_NAME_LABEL: plan.name, LWS_INDEX_LABEL: "0"},
                     "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}]}}


def _peer_policy(plan: LaunchPlan) -> Obj:
    """The NetworkPolicy sluice-workers (deploy/k8s/base) admits only the gateway to worker pods;
    the pods of one group must also reach each other on every port (Ray, NCCL, MPI over SSH)."""
    group = {"matchLabels": {LWS_NAME_LABEL: plan.name}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{plan.name}-peers", "labels": _labels(plan)},
            "spec": {"podSelector": group, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": group}]}]}}


def _pod_template(plan: LaunchPlan, role: str) -> Obj:
    volumes: list[Obj] = [
        {"name": "launch", "configMap": {"name": f"{plan.name}-launch", "defaultMode": 0o755}},
        {"name": "models", "persistentVolumeClaim": {"claimName": "sluice-models", "readOnly": True}},
        # NCCL and the engines' shared-memory transport outgrow the runtime's 64 MiB /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]
    mounts: list[Obj] = [{"name": "launch", "mountPath": SCRIPTS_DIR, "readOnly": True},
                         {"name": "models", "mountPath": "/models", "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}]
    if plan.engine == "trtllm" and plan.layout.nodes > 1:
        volumes.append({"name": "mpi-ssh", "secret": {"secretName": "sluice-mpi-ssh", "defaultMode": 0o600}})
        mounts.append({"name": "mpi-ssh", "mountPath": "/root/.ssh", "readOnly": True})
    container: Obj = {"name": role, "image": plan.image, "command": ["bash", f"{SCRIPTS_DIR}/{role}.sh"],
                      "env": _env(plan, role), "ports": _ports(plan, role), "volumeMounts": mounts,
                      "resources": {"limits": {"nvidia.com/gpu": plan.layout.gpus_per_node}}}
    if role == "leader":
        container.update(_probes())
    return {"metadata": {"labels": _labels(plan)},
            "spec": {"containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": 60}}


def _env(plan: LaunchPlan, role: str) -> list[Obj]:
    env: list[Obj] = [{"name": "SLUICE_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                      {"name": "SLUICE_WORKER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    if role == "leader":  # the node that serves HTTP: every route but /health and /metrics needs the key
        env.append({"name": "SLUICE_WORKER_KEY", "valueFrom": {"secretKeyRef": {
            "name": "sluice-worker-key", "key": "SLUICE_WORKER_KEY"}}})
    if role == "leader" and plan.gateway is not None:
        env.append({"name": "SLUICE_REGISTRATION_KEY", "valueFrom": {"secretKeyRef": {
            "name": "sluice-registration", "key": "SLUICE_REGISTRATION_KEY"}}})
    return env


def _ports(plan: LaunchPlan, role: str) -> list[Obj]:
    ports: list[Obj] = []
    if role == "leader":
        ports.append({"name": "http", "containerPort": WORKER_PORT})
        if plan.engine == "vllm" and plan.layout.nodes > 1:
            ports.append({"name": "ray", "containerPort": RAY_PORT})
    elif plan.engine == "trtllm":
        ports.append({"name": "ssh", "containerPort": SSH_PORT})
    return ports


def _probes() -> Obj:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    return {
        # Loading weights on every rank takes long: liveness starts only once startup has passed.
        "startupProbe": {**health, "periodSeconds": _STARTUP_PERIOD_S, "failureThreshold": _STARTUP_TRIES},
        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 30, "failureThreshold": 4, "timeoutSeconds": 10},
    }
