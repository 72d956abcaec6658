"""The pod template of each node role of a multi-node launch: hardened, sized, placed and probed.

Every pod runs with the RuntimeDefault seccomp profile, a read-only root filesystem (emptyDirs
for /tmp, caches and, for sshd, /run), no privilege escalation and no capabilities, as the
non-root user `POD_UID`. One exception: TensorRT-LLM across nodes runs as root, because
`mpirun` starts its remote ranks through sshd, and sshd must start as root (it changes to the
logged-in user and chroots its unprivileged half); its worker pods get back the three capabilities
that takes, and the leader, whose ssh client needs a passwd entry for its uid, runs as root with
none. Their ssh key pair comes from the Secret `sluice-mpi-ssh`, which an init container copies
into ~/.ssh with the modes sshd insists on (0700, files 0600): a Secret volume's own files are
symlinks into a group-readable directory, which sshd refuses.

Requests and limits make the pods Burstable, never BestEffort; the tolerations and the affinity
below are the defaults an overlay patches (GPU taints, GPU Feature Discovery's node label, and one
group's pods kept in one zone).
"""

from __future__ import annotations

import math
from typing import Any

from engines.launchers.plan import NODE_WAIT_S, RAY_PORT, SSH_PORT, WORKER_PORT, LaunchPlan

Obj = dict[str, Any]
SCRIPTS_DIR = "/opt/sluice-launch"
POD_UID = 10001  # numeric, so the kubelet can check runAsNonRoot whatever the image's USER says
SSH_SECRET = "sluice-mpi-ssh"
SSH_FILES = ("id_ed25519", "id_ed25519.pub", "authorized_keys")
SSHD_CAPABILITIES = ("SETUID", "SETGID", "SYS_CHROOT")  # sshd's privilege separation and its sessions
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"  # the LWS controller puts it on one group's pods
STARTUP_PERIOD_S, STARTUP_SLACK_S = 10, 60


def runs_as_root(plan: LaunchPlan) -> bool:
    return plan.engine == "trtllm" and plan.layout.nodes > 1


def startup_budget_s(plan: LaunchPlan) -> int:
    """What the leader's start-up probe allows: the wait for the other nodes, the launcher's own
    start-up limit, and a minute, so the launcher always gives up (with its own message) first."""
    wait_s = NODE_WAIT_S if plan.layout.nodes > 1 else 0
    return wait_s + plan.startup_timeout_s + STARTUP_SLACK_S


def pod_template(plan: LaunchPlan, role: str, labels: dict[str, str]) -> Obj:
    volumes, mounts = _volumes(plan, role)
    container: Obj = {"name": role, "image": plan.image, "command": ["bash", f"{SCRIPTS_DIR}/{role}.sh"],
                      "env": _env(plan, role), "ports": _ports(plan, role), "volumeMounts": mounts,
                      "resources": _resources(plan), "securityContext": _container_security(plan, role)}
    if role == "leader":
        container.update(_probes(plan))
    # No service-account token: nothing in a worker group calls the API server (the LWS controller
    # passes the group's layout as environment variables, and the gateway does the discovery).
    spec: Obj = {"automountServiceAccountToken": False, "securityContext": _pod_security(plan)}
    if runs_as_root(plan):
        spec["initContainers"] = [_ssh_keys_init(plan)]
    spec.update({"containers": [container], "volumes": volumes, "terminationGracePeriodSeconds": 60,
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                 "affinity": _affinity(plan)})
    return {"metadata": {"labels": labels}, "spec": spec}


def _volumes(plan: LaunchPlan, role: str) -> tuple[list[Obj], list[Obj]]:
    volumes: list[Obj] = [
        {"name": "launch", "configMap": {"name": f"{plan.name}-launch", "defaultMode": 0o755}},
        {"name": "models", "persistentVolumeClaim": {"claimName": "sluice-models", "readOnly": True}},
        # NCCL and the engines' shared-memory transport outgrow the runtime's 64 MiB /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        # The root filesystem is read-only: Ray's session files, MPI's and Python's temporary files, and
        # the compile and download caches (vLLM, Triton, Hugging Face) go here.
        {"name": "tmp", "emptyDir": {"sizeLimit": "20Gi"}},
        {"name": "cache", "emptyDir": {"sizeLimit": "50Gi"}}]
    mounts: list[Obj] = [{"name": "launch", "mountPath": SCRIPTS_DIR, "readOnly": True},
                         {"name": "models", "mountPath": "/models", "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "cache", "mountPath": "/var/cache/sluice"}]
    if runs_as_root(plan):
        volumes += [{"name": "ssh", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                    {"name": "ssh-secret", "secret": {"secretName": SSH_SECRET, "defaultMode": 0o400}}]
        mounts.append({"name": "ssh", "mountPath": "/root/.ssh"})
        if role == "worker":  # sshd's host key and privilege-separation directory
            volumes.append({"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
            mounts.append({"name": "run", "mountPath": "/run"})
    return volumes, mounts


def _ssh_keys_init(plan: LaunchPlan) -> Obj:
    files = " ".join(f"/etc/sluice/mpi-ssh/{f}" for f in SSH_FILES)
    return {"name": "ssh-keys", "image": plan.image, "command": [
                "sh", "-c", f"install -m 0600 {files} /root/.ssh/ && chmod 0700 /root/.ssh"],
            "volumeMounts": [{"name": "ssh-secret", "mountPath": "/etc/sluice/mpi-ssh", "readOnly": True},
                             {"name": "ssh", "mountPath": "/root/.ssh"}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
            "securityContext": _container_security(plan, "init")}


def _pod_security(plan: LaunchPlan) -> Obj:
    seccomp = {"seccompProfile": {"type": "RuntimeDefault"}}
    if runs_as_root(plan):
        return {"runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0, **seccomp}
    return {"runAsNonRoot": True, "runAsUser": POD_UID, "runAsGroup": POD_UID, "fsGroup": POD_UID, **seccomp}


def _container_security(plan: LaunchPlan, role: str) -> Obj:
    capabilities: Obj = {"drop": ["ALL"]}
    if runs_as_root(plan) and role == "worker":
        capabilities["add"] = list(SSHD_CAPABILITIES)
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": capabilities}


def _resources(plan: LaunchPlan) -> Obj:
    gpus = plan.layout.gpus_per_node
    memory = f"{plan.memory_gib_per_gpu * gpus}Gi"
    return {"requests": {"cpu": str(plan.cpu_per_gpu * gpus), "memory": memory},
            # No tight CPU limit: throttling shows up as latency; twice the request bounds a runaway.
            "limits": {"cpu": str(2 * plan.cpu_per_gpu * gpus), "memory": memory, "nvidia.com/gpu": gpus}}


def _affinity(plan: LaunchPlan) -> Obj:
    gpu_nodes = {"weight": 50, "preference": {"matchExpressions": [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}}
    one_zone = {"weight": 100, "podAffinityTerm": {
        "topologyKey": "topology.kubernetes.io/zone",
        "labelSelector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": plan.name}},
        "matchLabelKeys": [GROUP_KEY_LABEL]}}
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [gpu_nodes]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [one_zone]}}


def _env(plan: LaunchPlan, role: str) -> list[Obj]:
    home = "/root" if runs_as_root(plan) else "/tmp"
    env: list[Obj] = [{"name": "SLUICE_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                      {"name": "SLUICE_WORKER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                      {"name": "HOME", "value": home}, {"name": "XDG_CACHE_HOME", "value": "/var/cache/sluice"},
                      {"name": "HF_HOME", "value": "/var/cache/sluice/huggingface"}]
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


def _probes(plan: LaunchPlan) -> Obj:
    health = {"httpGet": {"path": "/health", "port": "http"}}
    tries = math.ceil(startup_budget_s(plan) / STARTUP_PERIOD_S)
    return {
        # Liveness starts only once start-up has passed: the other nodes, then weights on every rank.
        "startupProbe": {**health, "periodSeconds": STARTUP_PERIOD_S, "failureThreshold": tries},
        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 30, "failureThreshold": 4, "timeoutSeconds": 10},
    }
