"""GPU pods are sized, placed and protected: CPU and memory requests and limits (never BestEffort,
and room for their memory-backed /dev/shm), the nvidia.com/gpu taint tolerated, an affinity to
patch, and a PodDisruptionBudget over every group of GPU workers."""

from __future__ import annotations

import pytest

from tests.deploy.pods import gpus, overlay_docs, selects, templates
from tests.deploy.validation import OVERLAYS, by_kind

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _bytes(quantity: str) -> int:
    unit = quantity[-2:]
    return int(quantity[:-2]) * UNITS[unit] if unit in UNITS else int(quantity)


@pytest.mark.parametrize("name", [o for o in OVERLAYS if o != "cpu-dev"])
def test_gpu_pods_are_sized_placed_and_protected(name: str) -> None:
    docs = overlay_docs(name)
    budgets = by_kind(docs, "PodDisruptionBudget")
    checked = []
    for owner, template in templates(docs).items():
        spec = template["spec"]
        if not any(gpus(c) for c in spec["containers"]):
            continue
        for container in spec["containers"]:
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), (owner, kind)
            shm = sum(_bytes(v["emptyDir"]["sizeLimit"]) for v in spec["volumes"]
                      if v.get("emptyDir", {}).get("medium") == "Memory")
            assert _bytes(resources["limits"]["memory"]) > shm, f"{owner}: /dev/shm counts against the limit"
        assert GPU_TOLERATION in spec.get("tolerations", []), owner
        assert spec.get("affinity", {}).get("nodeAffinity"), owner
        covering = [b for b in budgets if selects(b["spec"]["selector"], template["metadata"]["labels"])]
        assert len(covering) == 1, f"{owner}: {len(covering)} PodDisruptionBudgets select it"
        assert covering[0]["spec"].get("maxUnavailable") == 1, owner  # 0 would block every node drain
        checked.append(owner)
    assert checked
