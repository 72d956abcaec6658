"""The Sluice image (deploy/images/gateway.Containerfile, built by `make image`) run with podman as the
manifests run it: uid 10001, a read-only root filesystem with a tmpfs at /tmp, models mounted
read-only. One gateway container serves /health, a chat (the official openai SDK, SmolLM2 in
process) and a digits infer (tritonclient over HTTP); a second container from the same image runs
`sluice worker --engine sim`, then one `--engine transformers`; each registers with the gateway
container, and a chat through the gateway reaches it.

The models are not in the image: the test lays out a repository whose LLM names its weights by an
absolute path under the mount (/models), as a PersistentVolumeClaim would hold them, and copies the
weights there from $SLUICE_CACHE (the cache's own files are readable by their owner only).

Runs only where the image is built (`make image`; `make image-test` builds it, then runs this),
as root, with podman (scripts/ensure_image_tools.sh), under the `image` marker.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.integration.vllm_support import free_port_pair, tiny_llama_dir
from tests.servers import DEFAULT_REPO, LLM_NAME, ROOT, free_port

VERSION = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
               if line.startswith("version = "))
IMAGE = os.environ.get("SLUICE_IMAGE", f"localhost/sluice:{VERSION}")
PODMAN = ["podman", "--runtime", "runc", "--storage-driver", "vfs"]
UID = 10001
WORKER_KEY = secrets.token_hex(24)
REGISTRATION_KEY = secrets.token_hex(24)
SIM_MODEL = "image-sim"
TRANSFORMERS_MODEL = "image-smollm2"  # served by the worker container alone
STARTUP_TIMEOUT_S = 600.0  # SmolLM2 loads and warms up in the container; the machine may be busy


def _image_built() -> bool:
    if os.geteuid() != 0 or shutil.which("podman") is None:
        return False
    return subprocess.run([*PODMAN, "image", "exists", IMAGE], capture_output=True, timeout=60).returncode == 0


pytestmark = [
    pytest.mark.integration, pytest.mark.image,
    pytest.mark.skipif(not _image_built(), reason=f"needs root, podman and the image {IMAGE}: make image"),
]


@dataclass
class Container:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str]

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PODMAN, "exec", self.name, *argv], capture_output=True, text=True, timeout=60,
                              env=self.env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        subprocess.run([*PODMAN, "stop", "-t", "20", self.name], capture_output=True, timeout=90, env=self.env)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _podman_env(tmp: Path) -> dict[str, str]:
    """crun and runc fail on setrlimit here unless podman sets no default ulimits (ENVIRONMENT.md)."""
    conf = tmp / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _run(name: str, tmp: Path, models: Path, env: dict[str, str], *argv: str,
         settings: dict[str, str] | None = None) -> Container:
    """`podman run` of the image in the foreground (its output to a log), as the manifests run it."""
    flags = ["--rm", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp", "--user", f"{UID}:{UID}",
             "--cap-drop", "all", "--security-opt", "no-new-privileges", "-v", f"{models}:/models:ro"]
    for key, value in (settings or {}).items():
        flags += ["-e", f"{key}={value}"]
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*PODMAN, "run", *flags, IMAGE, *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
    return Container(name, proc, log, env)


def _wait_healthy(url: str, container: Container, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if container.proc.poll() is not None:
            raise AssertionError(f"{container.name} exited ({container.proc.returncode}):\n{container.log()}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{container.name} not healthy after {timeout_s:.0f} s:\n{container.log()}")


def _readable_copy(src: Path, dst: Path) -> Path:
    """A copy that uid 10001 can read (the cache's weights are 0600, its directories 0700)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copyfile(f, dst / f.name)
    return dst


def _models(tmp: Path) -> Path:
    """/models: the LLM's weights, the sim's tokenizer, and a repository with the LLM and digits_onnx."""
    from engines.weights import cache_dir, resolve_llm
    from model_repository.classic_build import build_all

    models = tmp / "models"
    _readable_copy(resolve_llm(LLM_NAME, DEFAULT_REPO), models / LLM_NAME)
    _readable_copy(tiny_llama_dir(), models / "tiny-llama")
    repo = models / "repository"
    llm_config = (DEFAULT_REPO / LLM_NAME / "config.pbtxt").read_text()
    weights = next(line for line in llm_config.splitlines() if '"weights"' in line)
    (repo / LLM_NAME / "1").mkdir(parents=True)
    (repo / LLM_NAME / "config.pbtxt").write_text(
        llm_config.replace(weights, f'parameters {{ key: "weights" value {{ string_value: "/models/{LLM_NAME}" }} }}'))
    scratch = tmp / "classic"
    for name in ("digits_onnx", "breast_cancer_gb"):
        (scratch / name).mkdir(parents=True)
    build_all(scratch, cache_dir())  # trained once into the cache, then linked
    (repo / "digits_onnx" / "1").mkdir(parents=True)
    shutil.copyfile(DEFAULT_REPO / "digits_onnx" / "config.pbtxt", repo / "digits_onnx" / "config.pbtxt")
    shutil.copyfile(scratch / "digits_onnx" / "1" / "model.onnx", repo / "digits_onnx" / "1" / "model.onnx")
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return models


@dataclass
class Gateway:
    container: Container
    http_port: int
    grpc_port: int
    models: Path
    tmp: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("image")
    models = _models(tmp)
    env = _podman_env(tmp)
    http_port, grpc_port = free_port(), free_port()
    name = f"sluice-test-gateway-{secrets.token_hex(4)}"
    container = _run(name, tmp, models, env, "serve", "--host", "127.0.0.1", "--http-port", str(http_port),
                     "--grpc-port", str(grpc_port), "--model-repository", "/models/repository",
                     settings={"SLUICE_WORKER_KEY": WORKER_KEY, "SLUICE_REGISTRATION_KEY": REGISTRATION_KEY})
    try:
        _wait_healthy(f"http://127.0.0.1:{http_port}", container)
        yield Gateway(container, http_port, grpc_port, models, tmp)
    finally:
        container.stop()


def test_the_gateway_image_serves_health_a_chat_and_a_digits_infer(gateway: Gateway) -> None:
    from openai import OpenAI
    from sklearn.datasets import load_digits
    from tritonclient import http as triton

    health = httpx.get(gateway.url + "/health", timeout=10)
    assert health.status_code == 200, health.text

    client = OpenAI(base_url=gateway.url + "/v1", api_key="unused", timeout=120, max_retries=0)
    chat = client.chat.completions.create(model=LLM_NAME, max_tokens=16, temperature=0,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in (chat.choices[0].message.content or ""), chat

    digits = load_digits()
    x, y = (digits.data[:32] / 16.0).astype(np.float32), digits.target[:32]
    triton_client = triton.InferenceServerClient(f"127.0.0.1:{gateway.http_port}")
    assert triton_client.is_model_ready("digits_onnx")
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = triton_client.infer("digits_onnx", [inp], outputs=[triton.InferRequestedOutput("label")])
    labels = result.as_numpy("label").reshape(-1)
    assert (labels == y).mean() >= 0.9, (labels, y)


def test_the_image_runs_as_10001_on_a_read_only_root(gateway: Gateway) -> None:
    c = gateway.container
    assert c.exec("id", "-u").stdout.strip() == str(UID)
    status = c.exec("cat", "/proc/1/status").stdout
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(UID)] * 4, status
    assert "sluice" in c.exec("cat", "/proc/1/cmdline").stdout  # PID 1 is the entrypoint itself
    refused = c.exec("touch", "/opt/sluice/written")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
    assert c.exec("touch", "/tmp/written").returncode == 0  # the scratch tmpfs (HOME) is writable
    assert c.exec("printenv", "HOME").stdout.strip() == "/tmp"


def test_the_image_alone_starts_a_gateway_for_workers(tmp_path: Path) -> None:
    """No mount, no repository flag (deploy/k8s's gateway): it serves an empty repository and is
    ready; the default repository's configs ship as a template beside it, without weights."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    port = free_port()
    container = _run(f"sluice-test-bare-{secrets.token_hex(4)}", tmp_path, empty, _podman_env(tmp_path),
                     "serve", "--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0")
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", container, timeout_s=300)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"] == []
        template = container.exec("ls", "/opt/sluice/default-repository/smollm2-135m-instruct").stdout.split()
        assert template == ["1", "config.pbtxt"], template
        weights = container.exec("find", "/opt/sluice", "-name", "*.onnx", "-o", "-name", "*.safetensors", "-o",
                                 "-name", "*.gguf").stdout
        assert weights == "", weights
    finally:
        container.stop()


def _served(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


@contextmanager
def _worker(gateway: Gateway, name: str, port: int, *argv: str) -> Iterator[Container]:
    """A container of the same image running `sluice worker ...`, healthy and registered with the gateway."""
    worker = _run(name, gateway.tmp, gateway.models, gateway.container.env, "worker", *argv, "--host", "127.0.0.1",
                  "--port", str(port), "--name", name, "--gateway", gateway.url,
                  settings={"SLUICE_WORKER_KEY": WORKER_KEY, "SLUICE_REGISTRATION_KEY": REGISTRATION_KEY})
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", worker, timeout_s=STARTUP_TIMEOUT_S)
        registration = {"Authorization": f"Bearer {REGISTRATION_KEY}"}  # the `workers` scope lists them too
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = httpx.get(gateway.url + "/v1/admin/workers", headers=registration, timeout=10).json()["data"]
            if any(w["name"] == name for w in listed):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"{name} never registered:\n{worker.log()}\n{gateway.container.log()}")
        assert worker.exec("id", "-u").stdout.strip() == str(UID)
        yield worker
    finally:
        worker.stop()


def test_a_sim_worker_container_registers_with_the_gateway_container(gateway: Gateway) -> None:
    from openai import OpenAI

    port, kv_port = free_port_pair(), free_port_pair()
    with _worker(gateway, f"sluice-test-sim-{secrets.token_hex(4)}", port, "--engine", "sim",
                 "--model", "/models/tiny-llama", "--served-model-name", SIM_MODEL, "--profile", "vllm-cpu-tiny-llama",
                 "--kv-events-port", str(kv_port)):
        before = _served(port)
        client = OpenAI(base_url=gateway.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        chat = client.chat.completions.create(model=SIM_MODEL, max_tokens=8,
                                              messages=[{"role": "user", "content": "Name three rivers."}])
        assert chat.usage is not None and chat.usage.completion_tokens == 8, chat
        assert _served(port) == before + 1  # the worker container ran it, not the gateway


def test_a_transformers_worker_container_answers_through_the_gateway_container(gateway: Gateway) -> None:
    """`sluice worker --engine transformers` with SmolLM2 from the mount, under a name only it serves."""
    from openai import OpenAI

    with _worker(gateway, f"sluice-test-transformers-{secrets.token_hex(4)}", free_port(), "--engine", "transformers",
                 "--model", f"/models/{LLM_NAME}", "--served-model-name", TRANSFORMERS_MODEL, "--max-batch-size", "4"):
        client = OpenAI(base_url=gateway.url + "/v1", api_key="unused", timeout=120, max_retries=0)
        chat = client.chat.completions.create(model=TRANSFORMERS_MODEL, max_tokens=16, temperature=0,
                                              messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in (chat.choices[0].message.content or ""), chat
