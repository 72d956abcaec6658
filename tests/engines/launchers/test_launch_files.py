"""What `sluice launch` writes: node scripts (checked with shellcheck) and LeaderWorkerSet manifests
that pass the same validation as deploy/k8s (tests/deploy/validation.py), and the committed
multi-node overlays are exactly its current output."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from engines.launchers.lws import LWS_INDEX_LABEL
from engines.launchers.multinode import MANIFEST_FILE, add_launch_arguments, plan_from_args, render
from tests.deploy.validation import DEPLOY, validate


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_launch_arguments(parser)
    return parser.parse_args(list(argv))


def _files(*argv: str) -> dict[str, str]:
    return render(plan_from_args(_args(*argv)))


LAYOUTS = [
    ("--engine", "vllm", "--model", "/models/m", "--tp", "8", "--pp", "2", "--nodes", "2"),
    ("--engine", "vllm", "--model", "/models/m", "--tp", "16", "--nodes", "2", "--gpus-per-node", "8"),
    ("--engine", "vllm", "--model", "/models/m", "--tp", "4", "--nodes", "1", "--gateway", ""),
    ("--engine", "trtllm", "--model", "/models/m", "--tp", "8", "--pp", "4", "--nodes", "4"),
    ("--engine", "trtllm", "--model", "/models/m", "--tp", "2", "--nodes", "1", "--", "--ep_size", "2"),
]


@pytest.mark.parametrize("argv", LAYOUTS, ids=lambda a: "-".join(a[1::2][:5]))
def test_generated_manifests_validate(argv: tuple[str, ...]) -> None:
    docs = [d for d in yaml.safe_load_all(_files(*argv)[MANIFEST_FILE]) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service", "PodDisruptionBudget",
                                         "NetworkPolicy"]
    assert [validate(d) for d in docs] == ["builtin", "crd", "builtin", "builtin", "builtin"]
    plan = plan_from_args(_args(*argv))
    lws, service = docs[1], docs[2]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == plan.layout.nodes
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role in ("leaderTemplate", "workerTemplate"):
        if role in template:
            limits = template[role]["spec"]["containers"][0]["resources"]["limits"]
            assert limits["nvidia.com/gpu"] == plan.layout.gpus_per_node
    assert service["spec"]["selector"][LWS_INDEX_LABEL] == "0"  # leaders only: they serve HTTP
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == f"{plan.engine}-worker"


def test_a_broken_manifest_fails_the_same_validation() -> None:
    docs = [d for d in yaml.safe_load_all(_files(*LAYOUTS[0])[MANIFEST_FILE]) if d]
    docs[1]["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Sometimes"
    with pytest.raises(Exception, match="Sometimes"):
        validate(docs[1])


@pytest.mark.parametrize("argv", LAYOUTS, ids=lambda a: "-".join(a[1::2][:5]))
def test_scripts_pass_shellcheck(argv: tuple[str, ...], tmp_path: Path) -> None:
    scripts = {k: v for k, v in _files(*argv).items() if k.endswith(".sh")}
    assert "leader.sh" in scripts
    for name, text in scripts.items():
        (tmp_path / name).write_text(text)
    tool = shutil.which("shellcheck")
    cmd = [tool, "-s", "bash"] if tool else ["bash", "-n"]  # shellcheck comes with `make apt`
    for name in scripts:
        proc = subprocess.run([*cmd, str(tmp_path / name)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vllm_scripts_start_ray_then_serve_with_the_ray_executor() -> None:
    files = _files(*LAYOUTS[0])
    leader, worker = files["leader.sh"], files["worker.sh"]
    assert "ray start --head --port=6379" in leader and "--num-gpus=8" in leader
    assert leader.index("ray start --head") < leader.index("exec sluice worker")  # every node joins first
    serve = leader[leader.index("exec sluice worker"):]
    for flag in ("--engine vllm", "--tensor-parallel-size 8", "--pipeline-parallel-size 2",
                 "-- --distributed-executor-backend ray", '--gateway "$GATEWAY"'):
        assert flag in serve or flag in leader, flag
    assert 'ray start --address="$LEADER:6379"' in worker and "--block" in worker


def test_trtllm_scripts_run_one_mpi_world_over_every_node() -> None:
    files = _files(*LAYOUTS[3])
    leader = files["leader.sh"]
    served = leader[leader.index("SLUICE_TRTLLM_SERVE="):].split("\n")[0]
    argv = shlex.split(served.split("=", 1)[1].strip('"').replace("$HOSTFILE", "/tmp/hosts"))
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "32", "--hostfile"]
    assert argv[-2:] == ["trtllm-llmapi-launch", "trtllm-serve"]
    assert "slots=8" in leader and "--tensor-parallel-size 8 --pipeline-parallel-size 4" in leader
    assert "sshd -D" in files["worker.sh"]


@pytest.mark.parametrize("argv", LAYOUTS, ids=lambda a: "-".join(a[1::2][:5]))
def test_trtllm_leaders_say_they_are_unauthenticated_and_peers_reach_each_other(argv: tuple[str, ...]) -> None:
    """trtllm-serve checks no worker key, so `sluice worker` on the pod IP refuses it unless told
    --allow-unauthenticated (the port then left to the NetworkPolicy); vLLM leaders keep the key.
    The group's own policy admits the group's pods, and only them, to each other."""
    files = _files(*argv)
    serve = files["leader.sh"][files["leader.sh"].index("exec sluice worker"):]
    assert ("--allow-unauthenticated" in serve) == (argv[1] == "trtllm")
    plan = plan_from_args(_args(*argv))
    policy = next(d for d in yaml.safe_load_all(files[MANIFEST_FILE]) if d and d["kind"] == "NetworkPolicy")
    group = {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": plan.name}}
    assert policy["spec"]["podSelector"] == group and policy["spec"]["ingress"] == [{"from": [{"podSelector": group}]}]


def test_a_single_node_has_no_worker_role() -> None:
    files = _files(*LAYOUTS[2])
    assert set(files) == {"leader.sh", MANIFEST_FILE}
    assert "ray start" not in files["leader.sh"] and "--distributed-executor-backend" not in files["leader.sh"]
    assert "GATEWAY=${SLUICE_GATEWAY-''}" in files["leader.sh"]  # --gateway '': registers with none
    lws = [d for d in yaml.safe_load_all(files[MANIFEST_FILE]) if d][1]
    assert "leaderTemplate" not in lws["spec"]["leaderWorkerTemplate"]  # the one pod is built from workerTemplate


@pytest.mark.parametrize("overlay", ["multinode-vllm", "multinode-trtllm"])
def test_committed_overlays_are_the_current_output(overlay: str) -> None:
    """deploy/k8s/overlays/multinode-*/launch/ is what its recorded command writes today."""
    launch = DEPLOY / "overlays" / overlay / "launch"
    header = (launch / "leader.sh").read_text().splitlines()[1]
    command = header.split("`")[1]
    argv = shlex.split(command)
    assert argv[:2] == ["sluice", "launch"]
    expected = _files(*argv[2:])
    assert {p.name for p in launch.iterdir()} == set(expected)
    for name, text in expected.items():
        assert (launch / name).read_text() == text, f"{overlay}/launch/{name} is stale: run `{command} --out {launch}`"
