"""The network knobs of the multi-node overlays: NCCL's (and Gloo's) interface for every pod of a
group, and the opt-in `rdma` component (NCCL_IB_HCA and an RDMA device resource), which builds on
either overlay and still validates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.pods import templates
from tests.deploy.validation import DEPLOY, build, by_kind, validate

MULTINODE = ("multinode-vllm", "multinode-trtllm")
RDMA_RESOURCE = "rdma/rdma_shared_device_a"


def _env(container: dict[str, object]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", MULTINODE)
def test_every_pod_of_a_group_gets_the_nccl_interface(name: str) -> None:
    docs = build(DEPLOY / "overlays" / name)
    lws = {k: v for k, v in templates(docs).items() if "/" in k}
    assert set(lws) == {f"{name.split('-')[1]}-llama-70b/{r}" for r in ("leaderTemplate", "workerTemplate")}
    for owner, template in lws.items():
        env = _env(template["spec"]["containers"][0])
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0", owner
        assert "NCCL_IB_HCA" not in env  # RDMA is opt-in: a cluster without it could not schedule the pods


@pytest.mark.parametrize("name", MULTINODE)
def test_the_rdma_component_adds_the_hca_and_the_device(name: str, tmp_path: Path) -> None:
    overlay, component = DEPLOY / "overlays" / name, DEPLOY / "components" / "rdma"
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(overlay, tmp_path)], "components": [os.path.relpath(component, tmp_path)]}))
    docs = build(tmp_path)
    for doc in by_kind(docs, "LeaderWorkerSet"):
        validate(doc)
    plain = templates(build(overlay))
    for owner, template in templates(docs).items():
        if "/" not in owner:
            continue
        container = template["spec"]["containers"][0]
        assert _env(container)["NCCL_IB_HCA"] == "mlx5" and _env(container)["NCCL_SOCKET_IFNAME"] == "eth0"
        assert container["resources"]["limits"][RDMA_RESOURCE] == 1, owner
        # Nothing else changes: the capabilities and the rest of the pod stay as generated.
        before = plain[owner]["spec"]["containers"][0]
        assert container["securityContext"] == before["securityContext"], owner
        assert len(container["env"]) == len(before["env"]) + 1, owner
