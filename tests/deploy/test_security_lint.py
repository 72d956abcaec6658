"""Every overlay, as `kustomize build` renders it, passes checkov's Kubernetes checks (a security
linter from PyPI, in its own venv: scripts/ensure_checkov_venv.sh, `make checkov-venv`).

checkov knows the built-in workload kinds, not LeaderWorkerSet, so each LeaderWorkerSet's leader
and worker templates are linted as Deployments of their own (`<lws>-leader`, `<lws>-worker`).

Without a Prisma Cloud account checkov gives no severities, so no finding is taken as minor: every
one fails the test unless ALLOWED below lists it with its reason, and an ALLOWED entry that no
overlay produces any more fails too, so the list stays what the manifests need.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.pods import overlay_docs, templates
from tests.deploy.validation import OVERLAYS, ROOT

Obj = dict[str, Any]
ENSURE = ROOT / "scripts" / "ensure_checkov_venv.sh"
IMAGES = ("sluice-gateway", "sluice-transformers", "sluice-vllm", "sluice-redis", "vllm-llama-70b-leader",
          "vllm-llama-70b-worker", "trtllm-llama-70b-leader", "trtllm-llama-70b-worker")

ROOT_MPI = {"trtllm-llama-70b-leader", "trtllm-llama-70b-worker"}
# checkov check -> (the workloads it may flag, why the finding stands). One reason a line.
ALLOWED: dict[str, tuple[set[str], str]] = {
    "CKV_K8S_11": ({"sluice-gateway", "sluice-transformers", "sluice-redis"},  # CPU limits
                   "no CPU limit on purpose: CFS throttling shows as streaming latency (and as Redis stalls every "
                   "gateway waits on); the CPU request reserves their share"),
    "CKV_K8S_15": (set(IMAGES),  # imagePullPolicy Always
                   "images are pinned to release tags, so IfNotPresent: Always would contact the registry at every "
                   "restart of multi-GB GPU images; a cluster that must recheck pull secrets sets AlwaysPullImages"),
    "CKV_K8S_43": (set(IMAGES),  # image by digest
                   "images are referenced by tag: they are built locally (`make image`) and have no registry digest "
                   "until the operator pushes them; pin one with `kustomize edit set image` in the overlay"),
    "CKV_K8S_35": ({"sluice-gateway", "sluice-redis", "sluice-transformers", "sluice-vllm", "vllm-llama-70b-leader",
                    "trtllm-llama-70b-leader"},  # Secrets as environment variables
                   "Sluice reads its admin, attestation, registration and worker keys (redis-cli its password) from "
                   "environment variables, set from Secrets; only the API keys are a file (SLUICE_API_KEYS_FILE)"),
    "CKV_K8S_38": ({"sluice-gateway"},  # service-account token mounted
                   "the gateway watches EndpointSlices to find its workers (gateway-rbac.yaml); no other pod has one"),
    "CKV_K8S_23": (ROOT_MPI,  # root containers admitted
                   "TensorRT-LLM across nodes: mpirun starts remote ranks through sshd, which must start as root, and "
                   "the leader's ssh client needs a passwd entry (engines/launchers/pods.py; test_pod_security)"),
    "CKV_K8S_40": (ROOT_MPI,  # a uid of 10000 or more
                   "runs as root for sshd, as CKV_K8S_23 says"),
    "CKV_K8S_25": ({"trtllm-llama-70b-worker"},  # capabilities added
                   "sshd's privilege separation takes SETUID, SETGID and SYS_CHROOT back, no more (test_pod_security)"),
    "CKV_K8S_8": ({"vllm-llama-70b-worker", "trtllm-llama-70b-worker"},  # liveness probe
                  "a worker node's one process is `ray start --block` or `sshd -D`: if it stops, the container ends, "
                  "the group restarts; the leader's probes see the engine fail when a rank is lost"),
    "CKV_K8S_9": ({"vllm-llama-70b-worker", "trtllm-llama-70b-worker"},  # readiness probe
                  "no Service sends to a worker node's pod: the leader's readiness speaks for the group"),
}


def checkov() -> Path:
    """checkov from its cached venv, or skip (a failure in CI, where `make test` builds it)."""
    found = subprocess.run([str(ENSURE), "--installed"], capture_output=True, text=True, check=False)
    if found.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("checkov's venv is missing: `make test` should have run scripts/ensure_checkov_venv.sh")
        pytest.skip("checkov is not installed: `make checkov-venv` (scripts/ensure_checkov_venv.sh) builds it")
    return Path(found.stdout.strip()) / "bin" / "checkov"


def lintable(docs: list[Obj]) -> list[Obj]:
    """The overlay's objects, plus each LeaderWorkerSet pod template as a Deployment."""
    out = list(docs)
    namespaces = {d["metadata"]["name"]: d["metadata"].get("namespace") for d in docs if d["kind"] == "LeaderWorkerSet"}
    for owner, template in templates(docs).items():
        if "/" in owner:
            lws, role = owner.split("/")
            name = f"{lws}-{role.removesuffix('Template')}"
            out.append({"apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": name, "namespace": namespaces[lws]},
                        "spec": {"selector": {"matchLabels": template["metadata"]["labels"]}, "template": template}})
    return out


def run_checkov(files: dict[str, list[Obj]], tmp_path: Path) -> Obj:
    """checkov over one YAML file per entry, offline: no update check, no guideline download."""
    for name, docs in files.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    env = dict(os.environ, CKV_SKIP_PACKAGE_UPDATE_CHECK="true", BC_SKIP_MAPPING="TRUE")
    done = subprocess.run([str(checkov()), "--directory", str(tmp_path), "--framework", "kubernetes",
                           "--output", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: there were findings
    report: Obj = json.loads(done.stdout)
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    return report


def findings(report: Obj) -> set[tuple[str, str, str]]:
    """(file stem, check, resource) of every failed check."""
    return {(Path(f["file_path"]).stem, f["check_id"], f["resource"]) for f in report["results"]["failed_checks"]}


def test_every_overlay_passes_checkov(tmp_path: Path) -> None:
    report = run_checkov({name: lintable(overlay_docs(name)) for name in OVERLAYS}, tmp_path)
    checked = {(Path(c["file_path"]).stem, c["resource"]) for c in report["results"]["passed_checks"]}
    workloads = {(name, f"Deployment.sluice.{d['metadata']['name']}")
                 for name in OVERLAYS for d in lintable(overlay_docs(name)) if d["kind"] == "Deployment"}
    assert workloads <= checked, workloads - checked  # checkov saw every pod template
    assert {w.split(".")[-1] for _, w in workloads} == set(IMAGES)
    found = {(check, resource.split(".")[-1], overlay) for overlay, check, resource in findings(report)}
    unexplained = sorted(f"{overlay}: {check} {name}" for check, name, overlay in found
                         if name not in ALLOWED.get(check, (set(), ""))[0])
    assert not unexplained, "fix these, or add them to ALLOWED with a reason:\n" + "\n".join(unexplained)
    allowed = {(check, name) for check, (names, _) in ALLOWED.items() for name in names}
    stale = allowed - {(check, name) for check, name, _ in found}
    assert not stale, f"no longer found, remove from ALLOWED: {sorted(stale)}"


def test_checkov_flags_a_pod_that_loses_its_hardening(tmp_path: Path) -> None:
    """The linter is not vacuous: the gateway without a read-only root filesystem, its seccomp
    profile or its dropped capabilities gets the findings the test above would fail on."""
    docs = overlay_docs("cpu-dev")
    gateway = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "sluice-gateway")
    pod = gateway["spec"]["template"]["spec"]
    del pod["securityContext"]["seccompProfile"]
    del pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    del pod["containers"][0]["securityContext"]["capabilities"]
    found = {check for _, check, resource in findings(run_checkov({"cpu-dev": docs}, tmp_path))
             if resource == "Deployment.sluice.sluice-gateway"}
    assert {"CKV_K8S_31", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_37"} <= found, found
    assert not {"CKV_K8S_31", "CKV_K8S_22", "CKV_K8S_28", "CKV_K8S_37"} & set(ALLOWED)
