"""What a TensorRT-LLM launch across nodes needs to start under MPI, in the files `sluice launch`
writes: Open MPI keeps the pods' fully qualified names, the ssh key reaches ~/.ssh with the modes
sshd accepts (the init step is run here, on copies of its paths), and each pod's NCCL/CUDA/UCX
settings reach the ranks sshd starts (the worker's own lines are run here too)."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import yaml

from engines.launchers.multinode import MANIFEST_FILE, add_launch_arguments, plan_from_args, render
from engines.launchers.plan import NODE_WAIT_S
from engines.launchers.pods import startup_budget_s

ARGV = ("--engine", "trtllm", "--model", "/models/m", "--tp", "8", "--pp", "2", "--nodes", "2")


def _files(*argv: str) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    add_launch_arguments(parser)
    return render(plan_from_args(parser.parse_args(list(argv))))


def _templates(files: dict[str, str]) -> dict[str, Any]:
    lws = next(d for d in yaml.safe_load_all(files[MANIFEST_FILE]) if d and d["kind"] == "LeaderWorkerSet")
    return {k: v for k, v in lws["spec"]["leaderWorkerTemplate"].items() if k.endswith("Template")}


def test_open_mpi_keeps_the_pods_fully_qualified_names() -> None:
    leader = _files(*ARGV)["leader.sh"]
    assert "export OMPI_MCA_orte_keep_fqdn_hostnames=1\n" in leader
    assert leader.index("OMPI_MCA_orte_keep_fqdn_hostnames") < leader.index("exec sluice worker")


def test_the_ssh_key_is_copied_into_ssh_with_0700_and_0600(tmp_path: Path) -> None:
    for role, template in _templates(_files(*ARGV)).items():
        spec = template["spec"]
        secret = next(v["name"] for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "sluice-mpi-ssh")
        main = spec["containers"][0]
        assert all(m["name"] != secret for m in main["volumeMounts"]), role  # sshd refuses the Secret's own files
        ssh = next(m for m in main["volumeMounts"] if m["mountPath"] == "/root/.ssh")
        assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == ssh["name"]), role
        (init,) = spec["initContainers"]
        source = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == secret)
        assert {"name": ssh["name"], "mountPath": "/root/.ssh"} in init["volumeMounts"]
    # Run the init step on stand-ins of the Secret volume (0400 files, as mounted) and the emptyDir (0777).
    src, dst = tmp_path / "secret", tmp_path / "ssh"
    src.mkdir()
    dst.mkdir(mode=0o777)
    dst.chmod(0o777)
    for name in ("id_ed25519", "id_ed25519.pub", "authorized_keys"):
        (src / name).write_text(name)
        (src / name).chmod(0o400)
    script = init["command"][-1].replace(source, str(src)).replace("/root/.ssh", str(dst))
    subprocess.run([*init["command"][:-1], script], check=True, timeout=30)
    assert stat.S_IMODE(dst.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in dst.iterdir()} == {
        "id_ed25519": 0o600, "id_ed25519.pub": 0o600, "authorized_keys": 0o600}


def test_the_pods_nccl_cuda_and_ucx_settings_reach_the_ranks_sshd_starts(tmp_path: Path) -> None:
    worker = _files(*ARGV)["worker.sh"]
    assert "PermitUserEnvironment=yes" in worker  # sshd applies ~/.ssh/environment to its sessions
    assert '-o ListenAddress="$HOST_IP"' in worker  # root's sshd on the pod IP alone, not every address
    lines = [line for line in worker.splitlines() if ".ssh/environment" in line]
    (tmp_path / ".ssh").mkdir()
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1", "UCX_TLS": "rc,sm", "SLUICE_WORKER_KEY": "not-for-ranks"}
    subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], env=env, check=True, timeout=30)
    written = tmp_path / ".ssh" / "environment"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    got = dict(line.split("=", 1) for line in written.read_text().splitlines())
    assert {k: got.get(k) for k in env if k != "SLUICE_WORKER_KEY"} == {k: v for k, v in env.items()
                                                                       if k != "SLUICE_WORKER_KEY"}
    assert "SLUICE_WORKER_KEY" not in got  # keys stay out of the ranks' environment


def test_the_leaders_probe_allows_the_node_wait_and_the_start_up_limit() -> None:
    files = _files(*ARGV, "--startup-timeout-s", "2400")
    leader = _templates(files)["leaderTemplate"]["spec"]["containers"][0]
    assert "--startup-timeout-s 2400" in files["leader.sh"] and f"NODE_WAIT_S={NODE_WAIT_S}" in files["leader.sh"]
    probe = leader["startupProbe"]
    budget = probe["periodSeconds"] * probe["failureThreshold"]
    assert NODE_WAIT_S + 2400 <= budget <= NODE_WAIT_S + 2400 + 120
    parser = argparse.ArgumentParser()
    add_launch_arguments(parser)
    assert startup_budget_s(plan_from_args(parser.parse_args([*ARGV, "--startup-timeout-s", "2400"]))) <= budget
