"""Every pod of every overlay runs hardened: RuntimeDefault seccomp, non-root, a read-only root
filesystem with emptyDirs where its programs write, no privilege escalation, no capabilities. The
exceptions are listed here, each with its reason, and an exception no longer needed fails too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.pods import containers, overlay_docs, templates
from tests.deploy.validation import OVERLAYS

Obj = dict[str, Any]
# Pods that run as root: TensorRT-LLM across nodes starts its remote ranks through sshd, which must
# start as root; the leader's ssh client needs a passwd entry for its uid, which only root is sure to
# have in an image, and it logs in as root on the workers. Both keep every other setting hardened.
ROOT_PODS = {"trtllm-llama-70b/leaderTemplate", "trtllm-llama-70b/workerTemplate"}
# Capabilities given back: sshd's privilege separation (setuid/setgid to its `sshd` user, a chroot).
ADDED_CAPABILITIES = {("trtllm-llama-70b/workerTemplate", "worker"): {"SETUID", "SETGID", "SYS_CHROOT"}}
# The one pod that calls the API server (EndpointSlice discovery); no other pod gets a token.
API_CLIENTS = {"sluice-gateway"}
# Where each program writes, beyond the volumes it needs anyway: an emptyDir must be mounted there.
SCRATCH = {"sluice": "/tmp", "bash": "/tmp", "redis-server": "/data"}


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_pod_is_hardened(name: str) -> None:
    seen_root, seen_caps = set(), {}
    for owner, template in templates(overlay_docs(name)).items():
        pod = template["spec"].get("securityContext", {})
        assert template["spec"].get("automountServiceAccountToken", True) is (owner in API_CLIENTS), owner
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, owner
        if owner in ROOT_PODS:
            assert pod.get("runAsUser") == 0 and pod.get("runAsNonRoot") is False, owner
            seen_root.add(owner)
        else:
            assert pod.get("runAsNonRoot") is True and pod.get("runAsUser", 0) > 0, owner
            assert pod.get("runAsGroup", 0) > 0 and pod.get("fsGroup", 0) > 0, owner
        for container in containers(template):
            where = f"{owner}/{container['name']}"
            security = container.get("securityContext", {})
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not security.get("privileged") and "runAsUser" not in security, where
            added = set(security["capabilities"].get("add", []))
            assert added == ADDED_CAPABILITIES.get((owner, container["name"]), set()), where
            if added:
                seen_caps[(owner, container["name"])] = added
    assert seen_root == {o for o in ROOT_PODS if o.startswith(_lws_of(name))}
    assert seen_caps == {k: v for k, v in ADDED_CAPABILITIES.items() if k[0].startswith(_lws_of(name))}


def _lws_of(overlay: str) -> str:
    """The LeaderWorkerSet an overlay runs ("" matches nothing it runs)."""
    return f"{overlay.split('-')[1]}-llama-70b/" if overlay.startswith("multinode") else "\0"


@pytest.mark.parametrize("name", OVERLAYS)
def test_programs_write_to_emptydirs(name: str) -> None:
    """A read-only root filesystem needs a writable scratch directory where each program writes."""
    for owner, template in templates(overlay_docs(name)).items():
        empty = {v["name"] for v in template["spec"].get("volumes", []) if "emptyDir" in v}
        for container in template["spec"]["containers"]:
            command = " ".join(container.get("command", []))
            program = next((p for p in SCRATCH if p in command.split() or f"exec {p}" in command), None)
            assert program, f"{owner}: what does {command!r} write? add it to SCRATCH"
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get(SCRATCH[program]) in empty, (owner, SCRATCH[program])


@pytest.mark.parametrize("name", OVERLAYS)
def test_redis_starts_non_root_past_the_images_entrypoint(name: str) -> None:
    """The redis image's entrypoint switches from root to `redis` (uid 999) with setuid, which needs
    capabilities the pod drops: so Redis starts as a non-root uid itself, and past the entrypoint. The
    uid is the pods' 10001 (checkov CKV_K8S_40: not one below 10000 that a node's user may have)."""
    redis = templates(overlay_docs(name))["sluice-redis"]
    pod = redis["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (10001, 10001, 10001)
    command = redis["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and "exec redis-server" in command[-1]
    assert "docker-entrypoint" not in " ".join(command)
