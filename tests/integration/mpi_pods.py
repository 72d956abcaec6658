"""Two LeaderWorkerSet "pods" on one machine, for the loopback MPI smoke test: each node script that
`sluice launch --engine trtllm` writes runs as written, in a private mount and UTS namespace that
stands in for its pod (nothing of the machine's configuration is changed):

- the pod's hostname, and an /etc/hosts that names the group's pods by their fully qualified names,
  as the kubelet and the cluster's DNS would (leader 127.0.0.1, worker 127.0.0.2);
- /root as the image has it (0700), with the machine's Python bound back into it, and /root/.ssh an
  empty 0777 tmpfs, as the pod's emptyDir is, into which the manifest's own init step copies the
  ssh key pair from a stand-in of the Secret volume (0400 files);
- on the worker, /run as a tmpfs (the pod's emptyDir for sshd);
- the container's environment: the manifest's `env` (field and Secret references filled in), the
  image's PATH, and what a test adds (the worker pod's NCCL/CUDA/UCX settings).

`trtllm-llmapi-launch` and `trtllm-serve` on that PATH are STAND-INS written here (TensorRT-LLM needs
an NVIDIA GPU): every rank prints one `SMOKE-RANK {json}` line (its rank, its pod's hostname, its
ssh connection, the NCCL_/CUDA_/UCX_ settings it sees); rank 0 then runs tests/standins/trtllm_standin.py
(HTTP only, no real text), the other ranks wait for their MPI daemon to go, as real ranks would.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.servers import ROOT

LEADER_IP, WORKER_IP = "127.0.0.1", "127.0.0.2"
RANK_MARK = "SMOKE-RANK "
SECRET_PATH = "/etc/sluice/mpi-ssh"  # where the manifest mounts the Secret `sluice-mpi-ssh`
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_LAUNCH_STANDIN = """#!/bin/sh
# STAND-IN for TensorRT-LLM's trtllm-llmapi-launch (written by the MPI smoke test): runs its command.
exec "$@"
"""
_SERVE_STANDIN = """#!/bin/bash
# STAND-IN for trtllm-serve on every MPI rank (written by the MPI smoke test; not TensorRT-LLM).
PYTHONPATH={root} {python} -c '
import json, os, re, socket
seen = {{k: v for k, v in os.environ.items() if re.match("(NCCL|CUDA|UCX)_", k)}}
print("{mark}" + json.dumps({{"rank": os.environ.get("OMPI_COMM_WORLD_RANK"),
      "size": os.environ.get("OMPI_COMM_WORLD_SIZE"), "host": socket.gethostname(),
      "ssh": os.environ.get("SSH_CONNECTION"), "worker_key": "SLUICE_WORKER_KEY" in os.environ,
      "env": seen}}), flush=True)'
if [ "${{OMPI_COMM_WORLD_RANK:-0}}" = 0 ]; then
  PYTHONPATH={root} exec {python} -m tests.standins.trtllm_standin "$@"
fi
daemon=$PPID  # the other ranks join rank 0's world until it ends: here, until their MPI daemon goes
while kill -0 "$daemon" 2>/dev/null; do sleep 1; done
"""
_SLUICE_SHIM = """#!/bin/sh
# The `sluice` console script of an image, as this checkout's code.
PYTHONPATH={root} exec {python} -m gateway.cli "$@"
"""


def write_tools(bin_dir: Path) -> None:
    """The stand-ins and the `sluice` command on the pods' PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    fill = {"root": shlex.quote(str(ROOT)), "python": shlex.quote(sys.executable), "mark": RANK_MARK}
    for name, text in (("trtllm-llmapi-launch", _LAUNCH_STANDIN), ("trtllm-serve", _SERVE_STANDIN),
                       ("sluice", _SLUICE_SHIM)):
        (bin_dir / name).write_text(text.format(**fill) if "{" in text else text)
        (bin_dir / name).chmod(0o755)


def write_ssh_secret(secret: Path) -> None:
    """A key pair made for this test and its authorized_keys, with a Secret volume's modes (0400)."""
    secret.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sluice-smoke", "-f",
                    str(secret / "id_ed25519")], check=True, timeout=30)
    (secret / "authorized_keys").write_text((secret / "id_ed25519.pub").read_text())
    for path in secret.iterdir():
        path.chmod(0o400)


def pod_templates(manifest: str) -> dict[str, Any]:
    """{"leader": pod spec, "worker": pod spec} of the LeaderWorkerSet in `manifest`."""
    lws = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": template["leaderTemplate"]["spec"], "worker": template["workerTemplate"]["spec"]}


def pod_env(spec: dict[str, Any], values: dict[str, str], path: str) -> dict[str, str]:
    """The container's environment: its `env` with each reference looked up in `values` (by the
    field path, or the Secret's key), and the image's PATH."""
    env = {"PATH": path}
    for item in spec["containers"][0]["env"]:
        ref = item.get("valueFrom", {})
        key = ref["fieldRef"]["fieldPath"] if "fieldRef" in ref else ref.get("secretKeyRef", {}).get("key")
        env[item["name"]] = item["value"] if "value" in item else values[key]
    return env


def _prelude(spec: dict[str, Any], hostname: str, hosts: Path, secret: Path, keep: list[Path]) -> str:
    """The bash that turns a private mount/UTS namespace into the pod, then runs its init step."""
    lines = ["set -euo pipefail", f"hostname {hostname}", f"mount --bind {shlex.quote(str(hosts))} /etc/hosts",
             f"mount --bind /root {shlex.quote(str(secret.parent / ('real-root-' + hostname)))}",
             "mount -t tmpfs -o mode=0700 tmpfs /root"]
    for entry in keep:  # the machine's Python (and its caches), nothing else of the machine's /root
        real = secret.parent / f"real-root-{hostname}" / entry.name
        lines += [f"mkdir /root/{entry.name}", f"mount --bind {shlex.quote(str(real))} /root/{entry.name}"]
    lines += ["mkdir /root/.ssh", "mount -t tmpfs -o mode=0777 tmpfs /root/.ssh"]
    if any(m["mountPath"] == "/run" for m in spec["containers"][0]["volumeMounts"]):
        lines.append("mount -t tmpfs -o mode=0755 tmpfs /run")
    for init in spec.get("initContainers", []):
        *argv, script = init["command"]
        script = script.replace(SECRET_PATH, str(secret))
        lines.append(" ".join(shlex.quote(a) for a in [*argv, script]))
    return "\n".join(lines) + "\n"


def start_pod(spec: dict[str, Any], script: Path, hostname: str, env: dict[str, str], *, hosts: Path,
              secret: Path, log: Path) -> subprocess.Popen[bytes]:
    """Runs `bash script` as the pod's container would, after its init step, in its own namespaces."""
    (secret.parent / f"real-root-{hostname}").mkdir(exist_ok=True)
    keep = sorted({Path("/root") / p.relative_to("/root").parts[0] for p in
                   (Path(os.path.realpath(sys.executable)), Path.home() / ".cache") if p.is_relative_to("/root")})
    prelude = _prelude(spec, hostname, hosts, secret, keep) + f"cd / && exec bash {shlex.quote(str(script))}\n"
    with log.open("wb") as out:
        return subprocess.Popen(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c", prelude],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop_pod(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as the kubelet sends it; then SIGKILL to the pod's process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def rank_reports(log: str) -> dict[int, dict[str, Any]]:
    """Rank -> what the stand-in printed on that rank."""
    out: dict[int, dict[str, Any]] = {}
    for line in log.splitlines():
        if RANK_MARK in line:
            report = json.loads(line.split(RANK_MARK, 1)[1])
            out[int(report["rank"])] = report
    return out
