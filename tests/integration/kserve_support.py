"""Shared helpers for the KServe integration tests: a test model repository and a real server.

The server is the real `sluice serve` (gateway.cli) in a subprocess, in explicit
control mode with every model loaded at start (`--load-model '*'`), so the
repository extension can be exercised too. One server is shared by the KServe
test modules of a pytest process and stopped at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
REPO_SRC = ROOT / "model_repository"
CACHE = Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))

# A batched Sluice-API python model: Y = X.
ECHO_PY = "class SluiceModel:\n    def execute_batch(self, inputs):\n        return {'Y': inputs['X']}\n"
ECHO_CONFIG = '''
name: "echo"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''

ADD_SUB_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The add_sub example, as Triton's python_backend README writes it."""

    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (in_0.as_numpy() + in_1.as_numpy(), in_0.as_numpy() - in_1.as_numpy())
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
'''

ADD_SUB_CONFIG = '''
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU } ]
'''

# Blocks every execution while <gate_dir>/closed exists; touches <gate_dir>/started-N on entry.
GATED_PY = '''
import itertools, json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils

_ids = itertools.count()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = config["parameters"]["gate_dir"]["string_value"]

    def execute(self, requests):
        open(os.path.join(self.gate, f"started-{next(_ids)}"), "w").close()
        for _ in range(6000):  # bounded: 60 s at most
            if not os.path.exists(os.path.join(self.gate, "closed")):
                break
            time.sleep(0.01)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy().copy())]) for r in requests]
'''

GATED_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ default_queue_policy {{ {policy} }} }}
parameters {{ key: "gate_dir" value {{ string_value: "{gate}" }} }}
'''

BLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    {async_kw}def execute(self, requests):
        responses = []
        for request in requests:
            pixels = pb_utils.get_input_tensor_by_name(request, "PIXELS")
            bls = pb_utils.InferenceRequest(model_name="digits_onnx", requested_output_names=["label"],
                                            inputs=[pb_utils.Tensor("input", pixels.as_numpy())])
            result = {await_kw}bls.{call}()
            if result.has_error():
                raise pb_utils.TritonModelException(result.error().message())
            label = pb_utils.get_output_tensor_by_name(result, "label").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABEL", label)]))
        return responses
'''

BLS_CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "PIXELS" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "LABEL" data_type: TYPE_INT64 dims: [ 1 ] }} ]
'''

NUMPY_PY = '''
class SluiceModel:
    def execute_batch(self, inputs):
        return {"Y": inputs["X"] * 2}
'''

NUMPY_CONFIG = '''
name: "numpy_double"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
dynamic_batching { }
'''

TORCH_CONFIG = '''
name: "torch_affine"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
'''

BAD_CONFIGS = {
    "broken_config": 'name: "broken_config"\nbackend: "onnxruntime"\n'
                     'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ',
    "bad_dims": 'backend: "onnxruntime"\nmax_batch_size: 4\n'
                'input [ { name: "input" data_type: TYPE_FP32 dims: [ 0 ] } ]\n'
                'output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]',
    "bad_dtype": 'backend: "onnxruntime"\ninput [ { name: "input" data_type: TYPE_FOO dims: [ 64 ] } ]\n'
                 'output [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]',
    "missing_file": 'backend: "onnxruntime"\nmax_batch_size: 4\ninput [ { name: "input" data_type: TYPE_FP32 '
                    'dims: [ 64 ] } ]\noutput [ { name: "label" data_type: TYPE_INT64 dims: [ 1 ] } ]',
}




def _digits_variant(repo: Path, name: str, batching: str, versions: tuple[int, ...] = (1,), extra: str = "") -> None:
    src_model = repo / "digits_onnx" / "1" / "model.onnx"
    config = (REPO_SRC / "digits_onnx" / "config.pbtxt").read_text()
    config = config.replace('name: "digits_onnx"', f'name: "{name}"')
    config = config.replace("dynamic_batching { max_queue_delay_microseconds: 2000 }", batching) + extra
    (repo / name).mkdir()
    (repo / name / "config.pbtxt").write_text(config)
    for v in versions:
        (repo / name / str(v)).mkdir()
        os.link(src_model, repo / name / str(v) / "model.onnx")


def build_test_repo(root: Path) -> Path:
    """A repository with the shipped classic models plus the special models the tests need."""
    from model_repository.classic_build import build_all

    repo = root / "repo"
    repo.mkdir()
    for name in ("digits_onnx", "breast_cancer_gb", "digits_preprocess", "digits_postprocess", "digits_ensemble",
                 "all-minilm-l6-v2"):
        shutil.copytree(REPO_SRC / name, repo / name, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    build_all(repo, CACHE)
    # Long delay + preferred size: concurrent requests are certain to share executions.
    _digits_variant(repo, "digits_batched", "dynamic_batching { max_queue_delay_microseconds: 500000 "
                                            "preferred_batch_size: [ 16 ] }")
    _digits_variant(repo, "digits_unbatched", "")
    _digits_variant(repo, "digits_versions", "", (1, 2, 3), "version_policy { specific { versions: [ 1, 3 ] } }\n")
    _write(repo / "add_sub", ADD_SUB_CONFIG, ADD_SUB_PY)
    for name, policy in (("gated_queue", "max_queue_size: 2 allow_timeout_override: true"),
                         ("gated_timeout", "default_timeout_microseconds: 200000 timeout_action: REJECT")):
        gate = root / f"gate_{name}"
        gate.mkdir()
        _write(repo / name, GATED_CONFIG.format(name=name, policy=policy, gate=gate), GATED_PY)
    _write(repo / "bls_sync", BLS_CONFIG.format(name="bls_sync"),
           BLS_PY.format(async_kw="", await_kw="", call="exec"))
    _write(repo / "bls_async", BLS_CONFIG.format(name="bls_async"),
           BLS_PY.format(async_kw="async ", await_kw="await ", call="async_exec"))
    _write(repo / "numpy_double", NUMPY_CONFIG, NUMPY_PY)
    _torch_model(repo / "torch_affine")
    for name, text in BAD_CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    return repo


def _write(model_dir: Path, config: str, model_py: str) -> None:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    (model_dir / "1" / "model.py").write_text(model_py)


def _torch_model(model_dir: Path) -> None:
    import torch

    class Affine(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 3.0 + 1.0

    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(TORCH_CONFIG)
    torch.jit.script(Affine()).save(str(model_dir / "1" / "model.pt"))


@dataclass
class Server:
    root: Path
    repo: Path
    http_port: int
    grpc_port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def gate(self, model: str) -> Path:
        return self.root / f"gate_{model}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


_server: Server | None = None


def shared_server() -> Server:
    """Start (once per process) `sluice serve` on the test repository and wait until it is ready."""
    global _server
    if _server is not None:
        if _server.proc.poll() is not None:
            raise RuntimeError(f"the test server died:\n{_server.log()}")
        return _server
    root = Path(tempfile.mkdtemp(prefix="sluice-kserve-"))
    _server = start_server(root, build_test_repo(root))
    return _server


def start_server(root: Path, repo: Path, *extra: str) -> Server:
    """`sluice serve` in explicit mode with every model of `repo` loaded, plus `extra` flags; ready on return.

    The caller stops it (`Server.stop` also deletes `root`)."""
    http_port, grpc_port = free_port(), free_port()
    log_path = root / "server.log"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--http-port", str(http_port),
           "--grpc-port", str(grpc_port), "--model-repository", str(repo), "--model-control-mode", "explicit",
           "--load-model", "*", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = Server(root, repo, http_port, grpc_port, proc, log_path)
    atexit.register(server.stop)
    _wait_ready(server)
    return server


def write_model(repo: Path, name: str, config: str, model_py: str, versions: tuple[int, ...] = (1,)) -> Path:
    """A python model directory: `config.pbtxt` and `model.py` in each version directory."""
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    for v in versions:
        (model_dir / str(v)).mkdir()
        (model_dir / str(v) / "model.py").write_text(model_py)
    return model_dir


def _wait_ready(server: Server) -> None:
    for _ in range(600):  # bounded: ~120 s
        if server.proc.poll() is not None:
            raise RuntimeError(f"sluice serve exited with {server.proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"http://{server.http_url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"sluice serve did not become ready:\n{server.log()}")


def wait_for(predicate, what: str, attempts: int = 3000) -> None:
    """Poll `predicate` (bounded, ~60 s); used to sequence tests, never to assert on time."""
    for _ in range(attempts):
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
