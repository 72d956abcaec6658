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
`sluice-mpi-ssh` (an SSH key pair and its authorized_keys), which an init container copies into
/root/.ssh. The pod templates themselves (security, resources, placement, probes) are `pods.py`'s.
"""

from __future__ import annotations

from typing import Any

import yaml

from engines.launchers.plan import COMPONENT_LABEL, WORKER_PORT, LaunchPlan
from engines.launchers.pods import pod_template
from engines.launchers.scripts import scripts_for

Obj = dict[str, Any]
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def manifests_for(plan: LaunchPlan) -> list[Obj]:
    """ConfigMap, LeaderWorkerSet, Service, the groups' PodDisruptionBudget and NetworkPolicy, in apply order."""
    return [_scripts_configmap(plan), _leaderworkerset(plan), _leader_service(plan), _disruption_budget(plan),
            _peer_policy(plan)]


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
        template["leaderTemplate"] = pod_template(plan, "leader", _labels(plan))
        template["workerTemplate"] = pod_template(plan, "worker", _labels(plan))
    else:  # without a leaderTemplate, LWS builds the (only) pod from the workerTemplate
        template["workerTemplate"] = pod_template(plan, "leader", _labels(plan))
    return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet",
            "metadata": {"name": plan.name, "labels": _labels(plan)},
            "spec": {"replicas": 1, "startupPolicy": "LeaderCreated", "leaderWorkerTemplate": template}}


def _leader_service(plan: LaunchPlan) -> Obj:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{plan.name}-leader", "labels": _labels(plan)},
            "spec": {"selector": {LWS_NAME_LABEL: plan.name, LWS_INDEX_LABEL: "0"},
                     "ports": [{"name": "http", "port": WORKER_PORT, "targetPort": "http"}]}}


def _disruption_budget(plan: LaunchPlan) -> Obj:
    """One pod evicted recreates its whole group (RecreateGroupOnPodRestart): a node drain may take
    one pod while every other pod is ready, so it never has two groups down at once, and waits for a
    recreated group to be back before it goes on. (0 would block every drain of a GPU node.)"""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": plan.name, "labels": _labels(plan)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {LWS_NAME_LABEL: plan.name}}}}


def _peer_policy(plan: LaunchPlan) -> Obj:
    """The NetworkPolicy sluice-workers (deploy/k8s/base) admits only the gateway to worker pods;
    the pods of one group must also reach each other on every port (Ray, NCCL, MPI over SSH)."""
    group = {"matchLabels": {LWS_NAME_LABEL: plan.name}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{plan.name}-peers", "labels": _labels(plan)},
            "spec": {"podSelector": group, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": group}]}]}}
