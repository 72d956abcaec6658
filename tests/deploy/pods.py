"""The pods an overlay would run, as the tests see them: every pod template (Deployments, and a
LeaderWorkerSet's leader and worker templates) by owner, with the labels its pods will carry, and
label selectors evaluated as the API server does."""

from __future__ import annotations

import functools
import json
from typing import Any

from tests.deploy.validation import DEPLOY, build, by_kind

Obj = dict[str, Any]
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


@functools.cache
def _built(overlay: str) -> str:
    return json.dumps(build(DEPLOY / "overlays" / overlay))


def overlay_docs(overlay: str) -> list[Obj]:
    """`kustomize build` of an overlay, built once per test run; a fresh copy each call."""
    docs: list[Obj] = json.loads(_built(overlay))
    return docs


def templates(docs: list[Obj]) -> dict[str, Obj]:
    """Every pod template, by owner: a Deployment's name, or "<lws>/leaderTemplate" and
    "<lws>/workerTemplate"; its labels include the name label the LWS controller adds."""
    out = {d["metadata"]["name"]: d["spec"]["template"] for d in by_kind(docs, "Deployment")}
    for lws in by_kind(docs, "LeaderWorkerSet"):
        name = lws["metadata"]["name"]
        for role, template in lws["spec"]["leaderWorkerTemplate"].items():
            if role.endswith("Template"):
                labelled = json.loads(json.dumps(template))
                labelled["metadata"]["labels"][LWS_NAME] = name
                out[f"{name}/{role}"] = labelled
    return out


def pod_labels(docs: list[Obj]) -> dict[str, dict[str, str]]:
    return {owner: t["metadata"]["labels"] for owner, t in templates(docs).items()}


def containers(template: Obj) -> list[Obj]:
    """Init containers, then containers."""
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector object (matchLabels, matchExpressions) against labels; {} selects everything."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present = e["key"] in labels
        ok = {"In": present and labels[e["key"]] in e.get("values", []),
              "NotIn": not present or labels[e["key"]] not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def gpus(container: Obj) -> int:
    return int((container.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0))
