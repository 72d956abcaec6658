"""Loopback smoke test of the TensorRT-LLM launch across nodes: the files `sluice launch --engine trtllm
--nodes 2` writes, run for real with Debian's Open MPI and sshd, start the labelled trtllm-serve
STAND-IN on 2 MPI ranks, one per "pod" (tests/integration/mpi_pods.py: a private mount and UTS
namespace each, nothing of the machine's configuration changed). The worker pod's sshd runs as
worker.sh starts it; the leader's mpirun reaches it over ssh by the worker's fully qualified name.

It shows: Open MPI keeps the pods' fully qualified names (without
OMPI_MCA_orte_keep_fqdn_hostnames=1 it cannot reach the worker), sshd (StrictModes on, its default)
accepts the key the init step copied, each rank sees its own pod's NCCL_/CUDA_/UCX_ settings (rank 1
through sshd's ~/.ssh/environment), and rank 0 serves /health and a completion through a real
gateway the leader registered with. NOT shown: real hosts, a real network between them, GPUs,
TensorRT-LLM itself. `make smoke-multinode` runs just this module (marker `multinode`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engines.weights import resolve_llm
from tests.integration import mpi_pods
from tests.servers import ROOT, Server, start_server

pytestmark = [
    pytest.mark.integration, pytest.mark.multinode,
    pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("mpirun") and os.path.exists("/usr/sbin/sshd")),
                       reason="needs root, Open MPI (openmpi-bin) and sshd (openssh-server): make apt"),
]

NAME, NAMESPACE = "trtllm-smoke", "sluice"
LEADER_POD, WORKER_POD = f"{NAME}-0", f"{NAME}-0-1"
LEADER_FQDN = f"{LEADER_POD}.{NAME}.{NAMESPACE}"  # LWS_LEADER_ADDRESS: <name>-<group>.<subdomain>.<namespace>
WORKER_FQDN = f"{WORKER_POD}.{NAME}.{NAMESPACE}"
MODEL = "smoke-model"
REGISTRATION_KEY, WORKER_KEY = "smoke-registration-key-0123456789", "smoke-worker-key-0123456789abcdef"
WORKER_SETTINGS = {"NCCL_SOCKET_IFNAME": "eth-worker", "NCCL_IB_HCA": "mlx5_1", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                   "UCX_TLS": "rc,sm"}
LEADER_SETTINGS = {"NCCL_SOCKET_IFNAME": "eth-leader", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}


@dataclass
class Group:
    tmp: Path
    files: Path
    templates: dict[str, dict]
    gateway: Server
    worker: subprocess.Popen[bytes]

    def start_leader(self, script: Path, log: Path) -> subprocess.Popen[bytes]:
        values = {"status.podIP": mpi_pods.LEADER_IP, "metadata.name": LEADER_POD, "SLUICE_WORKER_KEY": WORKER_KEY,
                  "SLUICE_REGISTRATION_KEY": REGISTRATION_KEY}
        env = {**mpi_pods.pod_env(self.templates["leader"], values, _path(self.tmp)), **LEADER_SETTINGS,
               "LWS_LEADER_ADDRESS": LEADER_FQDN, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
        return mpi_pods.start_pod(self.templates["leader"], script, LEADER_POD, env, hosts=self.tmp / "hosts",
                                  secret=self.tmp / "secret", log=log)


def _path(tmp: Path) -> str:
    return f"{tmp / 'bin'}:{mpi_pods.IMAGE_PATH}"


def _until(what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-6000:]
            raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{tail}")
        time.sleep(0.2)
    raise AssertionError(f"never: {what}\n{log.read_text(errors='replace')[-6000:]}")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def _model_dir() -> Path:
    """A local transformers directory: the gateway tokenizes for the model the leader registers."""
    return resolve_llm("smollm2-135m-instruct", ROOT / "model_repository")


def _launch(tmp: Path, gateway: str) -> Path:
    out = tmp / "launch"
    subprocess.run([sys.executable, "-m", "gateway.cli", "launch", "--engine", "trtllm", "--model", str(_model_dir()),
                    "--tp", "1", "--pp", "2", "--nodes", "2", "--name", NAME, "--served-model-name", MODEL,
                    "--gateway", gateway, "--startup-timeout-s", "120", "--out", str(out)],
                   cwd=ROOT, check=True, timeout=60, capture_output=True)
    return out


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """The gateway, the generated files, and the worker pod's sshd, listening on the worker's address."""
    tmp = tmp_path_factory.mktemp("mpi-smoke")
    (tmp / "repo").mkdir()
    gateway = start_server(["--model-repository", str(tmp / "repo")], tmp / "gateway.log",
                           env={"SLUICE_REGISTRATION_KEY": REGISTRATION_KEY, "SLUICE_WORKER_KEY": WORKER_KEY})
    worker = None
    try:
        files = _launch(tmp, gateway.url)
        templates = mpi_pods.pod_templates((files / "leaderworkerset.yaml").read_text())
        mpi_pods.write_tools(tmp / "bin")
        mpi_pods.write_ssh_secret(tmp / "secret")
        (tmp / "hosts").write_text(f"127.0.0.1\tlocalhost\n{mpi_pods.LEADER_IP}\t{LEADER_FQDN} {LEADER_POD}\n"
                                   f"{mpi_pods.WORKER_IP}\t{WORKER_FQDN}\n")  # the worker's: what DNS would answer
        values = {"status.podIP": mpi_pods.WORKER_IP, "metadata.name": WORKER_POD}
        env = {**mpi_pods.pod_env(templates["worker"], values, _path(tmp)), **WORKER_SETTINGS,
               "LWS_LEADER_ADDRESS": LEADER_FQDN, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
        worker = mpi_pods.start_pod(templates["worker"], files / "worker.sh", WORKER_POD, env, hosts=tmp / "hosts",
                                    secret=tmp / "secret", log=tmp / "worker.log")
        _until("the worker's sshd listens", lambda: _listening(mpi_pods.WORKER_IP, 2222), worker,
               tmp / "worker.log", 60)
        yield Group(tmp, files, templates, gateway, worker)
    finally:
        if worker is not None:
            mpi_pods.stop_pod(worker)
        gateway.stop()


def test_the_generated_mpi_launch_starts_the_standin_on_two_ranks(group: Group) -> None:
    log = group.tmp / "leader.log"
    leader = group.start_leader(group.files / "leader.sh", log)
    try:
        _until("the leader serves /health", lambda: _get(f"http://{mpi_pods.LEADER_IP}:8100/health") == 200,
               leader, log, 120)
        reports = mpi_pods.rank_reports(log.read_text(errors="replace"))
        assert sorted(reports) == [0, 1], log.read_text(errors="replace")[-4000:]
        rank0, rank1 = reports[0], reports[1]
        assert rank0["size"] == rank1["size"] == "2"
        assert (rank0["host"], rank1["host"]) == (LEADER_POD, WORKER_POD)  # one rank in each pod
        assert rank1["ssh"] and rank1["ssh"].split()[2:] == [mpi_pods.WORKER_IP, "2222"]  # through the worker's sshd
        assert rank1["env"] == WORKER_SETTINGS  # the worker pod's own settings, through ~/.ssh/environment
        assert rank0["env"] == LEADER_SETTINGS
        assert rank0["worker_key"] and not rank1["worker_key"]  # the key stays on the serving rank
        sshd = (group.tmp / "worker.log").read_text(errors="replace")
        assert f"Server listening on {mpi_pods.WORKER_IP} port 2222" in sshd  # the pod IP alone
        assert "Server listening on 0.0.0.0" not in sshd and "Server listening on ::" not in sshd
        assert "Accepted publickey for root" in sshd and "bad ownership or modes" not in sshd
        _until("the gateway routes to the leader", lambda: _completion(group.gateway.url) == 200, leader, log, 60)
    finally:
        mpi_pods.stop_pod(leader)


def test_without_keep_fqdn_open_mpi_cannot_reach_the_worker(group: Group) -> None:
    """The control: the same leader script less its OMPI_MCA_orte_keep_fqdn_hostnames line fails, as
    on a cluster, because Open MPI cuts the worker's name to a pod name nothing resolves."""
    text = (group.files / "leader.sh").read_text()
    assert "export OMPI_MCA_orte_keep_fqdn_hostnames=1\n" in text
    script = group.tmp / "leader-shortened.sh"
    script.write_text(text.replace("export OMPI_MCA_orte_keep_fqdn_hostnames=1\n", ""))
    log = group.tmp / "leader-shortened.log"
    leader = group.start_leader(script, log)
    try:
        leader.wait(timeout=120)
        text = log.read_text(errors="replace")
        assert leader.returncode != 0, text[-4000:]
        assert f"Could not resolve hostname {WORKER_POD}:" in text, text[-4000:]
        assert mpi_pods.RANK_MARK not in text  # no rank started
    finally:
        mpi_pods.stop_pod(leader)


def _get(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def _completion(gateway: str) -> int:
    try:
        resp = httpx.post(gateway + "/v1/completions", json={"model": MODEL, "prompt": "smoke", "max_tokens": 4},
                          timeout=30)
    except httpx.HTTPError:
        return 0
    if resp.status_code == 200:
        assert resp.json()["choices"][0]["text"]
    return resp.status_code
