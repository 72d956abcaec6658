"""Manifest validation shared by the deploy tests: built-in kinds with `kubernetes-validate`
(strict: unknown fields are errors, as with `kubectl apply --validate=strict`), custom
resources against the published CRD schemas vendored in tests/deploy/crds/, and
`kustomize build` through pykustomize (kustomize's Go library in a wheel).
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.33.0"  # the Kubernetes release the manifests are validated against
CRD_DIR = Path(__file__).parent / "crds"
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "k8s"
OVERLAYS = ("cpu-dev", "gpu-vllm", "multinode-vllm", "multinode-trtllm")


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict JSON schema of that custom resource."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                out[(f"{group}/{version['name']}", kind)] = schema
    return out


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Refuse fields the schema does not declare, as the API server's strict field validation
    does (it would otherwise prune them silently), except where the schema preserves them."""
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for key in ("properties", "patternProperties"):
        for sub in (schema.get(key) or {}).values():
            strict(sub)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            strict(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            strict(sub)
    return schema


def validate(doc: dict[str, Any]) -> str:
    """Validate one object; returns how ("builtin" or "crd"). Raises on any problem, including
    a kind that neither Kubernetes nor a vendored CRD defines."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    schema = crd_schemas().get(key)
    if schema is not None:
        jsonschema.Draft202012Validator(schema).validate(doc)
        _check_metadata(doc)
        return "crd"
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return "builtin"


def _check_metadata(doc: dict[str, Any]) -> None:
    """CRD schemas leave metadata to the API server; check it like a built-in object's."""
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata", {})}
    kubernetes_validate.validate(meta, K8S_VERSION, strict=True)
    if not meta["metadata"].get("name"):
        raise ValueError(f"{doc['kind']} without metadata.name")


def build(path: Path) -> list[dict[str, Any]]:
    """`kustomize build path`, parsed."""
    from pykustomize import build as kustomize_build

    result = asyncio.run(kustomize_build(str(path)))
    return [d for d in yaml.safe_load_all(result.yaml) if d]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]
