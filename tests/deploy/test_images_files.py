"""The image recipes, read (no build): deploy/images/*.Containerfile and requirements-runtime.txt.

The images install requirements-runtime.txt, the runtime part of requirements.txt. That file stays
as it is (its hash keys the cached dependency venv), so the two lists are kept in step here: every
runtime package is pinned exactly as in requirements.txt, and no test or lint tool gets in.
tests/integration/test_images.py runs the built image itself.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "deploy" / "images"
TEST_AND_LINT = {"pytest", "pytest-asyncio", "pytest-timeout", "hypothesis", "matplotlib", "kubernetes-validate",
                 "jsonschema", "schemathesis", "playwright", "ruff", "mypy", "import-linter", "vulture",
                 "scikit-learn", "skl2onnx", "openai", "langchain-openai", "langchain-core", "promql-parser",
                 "grafana-foundation-sdk", "opentelemetry-proto", "pykustomize", "cffi", "types-pyyaml"}


def _requirements(path: Path) -> dict[str, Requirement]:
    reqs = {}
    for line in path.read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            req = Requirement(line)
            reqs[canonicalize_name(req.name)] = req
    return reqs


def test_every_runtime_package_is_pinned_as_in_requirements_txt() -> None:
    full, runtime = _requirements(ROOT / "requirements.txt"), _requirements(ROOT / "requirements-runtime.txt")
    assert runtime, "requirements-runtime.txt is empty"
    for name, req in runtime.items():
        assert name in full, f"{name} is in requirements-runtime.txt but not requirements.txt"
        assert req.specifier == full[name].specifier, f"{name}: {req.specifier} here, {full[name].specifier} there"
        assert req.extras <= full[name].extras, f"{name}: extras {req.extras - full[name].extras} not tested"
    assert not set(runtime) & TEST_AND_LINT, "a test or lint tool in the images"
    assert runtime["torch"].specifier == full["torch"].specifier  # the CPU wheel; any other torch pulls CUDA


def test_what_sluice_imports_at_run_time_is_in_the_runtime_list() -> None:
    """The pyproject's own dependencies and the extras the images serve (transformers, classic,
    k8s, tracing) are all installed by the images."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("transformers", "classic", "k8s", "tracing"):
        wanted += project["optional-dependencies"][extra]
    runtime = _requirements(ROOT / "requirements-runtime.txt")
    missing = {canonicalize_name(Requirement(r).name) for r in wanted} - set(runtime)
    assert not missing, f"not in requirements-runtime.txt: {sorted(missing)}"


def _stages(path: Path) -> list[str]:
    """The Containerfile's stages, each as its text from its FROM on (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return ["FROM" + part for part in re.split(r"^FROM", text, flags=re.M)[1:]]


@pytest.mark.parametrize("name", ["gateway", "vllm", "trtllm"])
def test_each_image_runs_sluice_as_10001_without_weights(name: str) -> None:
    path = IMAGES / f"{name}.Containerfile"
    final = _stages(path)[-1]
    assert re.search(r"^USER 10001(:10001)?$", final, re.M), f"{path}: the final stage must run as uid 10001"
    assert re.search(r"^ENV .*\bHOME=/tmp\b", final, re.M), f"{path}: HOME must be the writable /tmp"
    assert 'ENTRYPOINT ["sluice"]' in final
    assert "sluice = " in (ROOT / "pyproject.toml").read_text()  # the console script the entrypoint runs
    assert not re.search(r"\.(safetensors|gguf|onnx|pt)\b", path.read_text()), f"{path} copies weights"


def test_the_gateway_image_is_multi_stage_on_a_debian_base_argument() -> None:
    text = (IMAGES / "gateway.Containerfile").read_text()
    assert "ARG BASE=debian:bookworm-slim" in text
    stages = _stages(IMAGES / "gateway.Containerfile")
    assert [s.split()[1] for s in stages] == ["${BASE}", "${BASE}"]
    assert "pip" not in stages[-1].replace("pip setuptools wheel", ""), "the final stage installs nothing with pip"
    assert "COPY --from=builder /opt/venv /opt/venv" in stages[-1]
    assert re.search(r"^EXPOSE 8000 8001$", stages[-1], re.M)


@pytest.mark.parametrize(("name", "arg"), [("vllm", "VLLM_BASE"), ("trtllm", "TRTLLM_BASE")])
def test_the_gpu_worker_images_take_their_upstream_base_as_an_argument(name: str, arg: str) -> None:
    text = (IMAGES / f"{name}.Containerfile").read_text()
    assert re.search(rf"^ARG {arg}=\S+", text, re.M)
    assert all(s.split()[1] == f"${{{arg}}}" for s in _stages(IMAGES / f"{name}.Containerfile"))


def test_weights_stay_out_of_the_build_context() -> None:
    ignored = (ROOT / ".containerignore").read_text().split()
    for pattern in ("model_repository/**/*.onnx", "model_repository/**/*.safetensors", ".venv", ".git"):
        assert pattern in ignored
