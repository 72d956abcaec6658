"""What a python model in its own process may reach, tried from real model processes (the backend
directly, as the server's instance thread drives it): no secrets in its environment, no process
that outlives it, and, as another user, no signal to the server and no other model's tensors."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from engines.classic.errors import ConfigError, InferError
from engines.classic.execution.backends import isolated, sandbox
from engines.classic.limits import ClassicLimits, isolation
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.config import parse_text
from engines.classic.request import InferRequest

MODEL_PY = '''
import json, os, subprocess, time
import numpy as np
import triton_python_backend_utils as pb_utils


def probe(p):
    """What of the server and of another model this process can reach."""
    r = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "reached": [], "found": False}
    try:
        os.kill(p["server_pid"], 0)
        r["kill"] = "allowed"
    except PermissionError:
        r["kill"] = "PermissionError"
    paths = [os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm") if n.startswith("sluice")]
    for pid in (p["server_pid"], p["other_pid"]):
        paths.append(f"/proc/{pid}/mem")
        try:
            paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except PermissionError:
            r[f"fd_list_{pid}"] = "PermissionError"
    for path in paths:
        try:
            if "memfd" not in os.readlink(path) and "/fd/" in path:
                continue
        except OSError:
            pass
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 16)
        except OSError:
            continue
        r["reached"].append(path)
        r["found"] = r["found"] or p["marker"].encode() in data
    r["dev_shm"] = [n for n in os.listdir("/dev/shm") if n.startswith("sluice")]
    return r


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            p = json.loads(request.parameters())
            action, report = p.get("action", ""), {}
            if action == "env":
                report = dict(os.environ)
            elif action == "spawn":  # a sleeping grandchild in our group, and one that left it
                kept = subprocess.Popen(["sleep", "600"])
                left = subprocess.Popen(["sleep", "600"], start_new_session=True)
                report = {"pids": [kept.pid, left.pid]}
                with open(p["pids"], "w") as f:
                    json.dump(report["pids"], f)
                if p["then"] == "hang":
                    time.sleep(600)
                if p["then"] == "exit":
                    os._exit(1)
            elif action == "probe":
                report = probe(p)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(report).encode()],
                                                                                     dtype=object))]))
        return out
'''
CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
'''
SECRETS = {name: f"secret-{i}-9f2c41" for i, name in enumerate(
    ["SLUICE_API_KEYS", "SLUICE_ADMIN_KEY", "SLUICE_ADMIN_KEYS", "SLUICE_WORKER_KEY", "AWS_SECRET_ACCESS_KEY",
     "HF_TOKEN", "DB_PASSWORD", "MY_API_KEY", "OPENAI_API_KEY"])}


def _model(root: Path, name: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MODEL_PY)
    return root / name / "1"


def _backend(version_dir: Path, limit_s: float = 0.0, user: str | None = None) -> isolated.IsolatedPythonBackend:
    config = parse_text(CONFIG.format(name=version_dir.parent.name), "test")
    return isolated.IsolatedPythonBackend(config, version_dir, 0, limit_s, user)


def _run(backend: isolated.IsolatedPythonBackend, text: bytes = b"x", **params: object) -> dict | InferError:
    request = InferRequest(backend.config.name, "1", {"X": np.array([text], dtype=object)}, parameters=params)
    (result,) = backend.execute([request])
    return result if isinstance(result, InferError) else json.loads(result["OUT"][0])


@pytest.fixture()
def models() -> Iterator[Path]:
    """A repository every user may read (pytest's tmp_path is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="sluice-sandbox-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_model_process_sees_none_of_the_servers_secrets(models, monkeypatch):
    for name, value in {**SECRETS, "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "3"}.items():
        monkeypatch.setenv(name, value)
    backend = _backend(_model(models, "env"))
    try:
        env = _run(backend, action="env")
    finally:
        backend.close()
    assert not set(SECRETS) & set(env), env
    assert not any(value in json.dumps(env) for value in SECRETS.values())
    assert env["LC_ALL"] == "C.UTF-8" and env["OMP_NUM_THREADS"] == "3"  # the allow-list still passes these
    assert str(isolated._ROOT) in env["PYTHONPATH"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int]) -> list[int]:
    """The pids still alive after a bounded wait for them to go (sequencing, not a timing assertion)."""
    for _ in range(200):
        if all(_gone(p) for p in pids):
            break
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


@pytest.mark.parametrize("then, must_go", [("hang", 2), ("exit", 1), ("close", 1)])
def test_what_the_model_started_dies_with_its_process(models, then, must_go):
    """On a timeout the whole group dies, and a grandchild that left it while its parent lived; on a crash or
    a close the group dies (one that left the group after its parent exited is beyond reach: see sandbox)."""
    backend = _backend(_model(models, f"spawn_{then}"), limit_s=3.0)
    pids_file, pids = models / "pids.json", []
    try:
        result = _run(backend, action="spawn", then=then, pids=str(pids_file))
        pids = json.loads(pids_file.read_text())
        if then == "hang":
            assert isinstance(result, InferError) and "time limit of 3 s" in result.message
        elif then == "exit":
            assert isinstance(result, InferError) and "exit code 1" in result.message
        else:
            assert result == {"pids": pids} and not any(_gone(p) for p in pids)  # they run until the close
            backend.close()
        assert _wait_gone(pids[:must_go]) == []
    finally:
        backend.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_no_segment_has_a_name_another_process_could_open(models):
    one, other = _backend(_model(models, "one")), _backend(_model(models, "other"))
    try:
        assert not isinstance(_run(other, b"other-model-secret-tensor"), InferError)
        report = _run(one, action="probe", server_pid=os.getpid(), other_pid=other._proc.pid,
                      marker="other-model-secret-tensor")
    finally:
        one.close()
        other.close()
    assert report["dev_shm"] == [] and not any(p.startswith("/dev/shm") for p in report["reached"]), report


# ---- --python-model-user ------------------------------------------------------------------------------------
_IMPORTS = "import numpy, engines.classic.execution.backends.stub, engines.classic.execution.backends.python"


def _runs_as_nobody(python: str, pythonpath: str) -> bool:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(isolated._ROOT), pythonpath])}
    try:
        done = subprocess.run([python, "-c", _IMPORTS], env=env, user="nobody", extra_groups=[], cwd="/",
                              capture_output=True, check=False)
    except PermissionError:  # it may not even run the interpreter
        return False
    return done.returncode == 0


def _linked_packages(into: Path) -> None:
    """Hard links to the packages the model process imports (where the server's live under a home only root
    may enter: the test environment's, not a deployment's), in a folder every user may read."""
    code = (f"{_IMPORTS}; import sys, json; "
            "print(json.dumps([getattr(m, '__file__', None) for m in sys.modules.values()]))")
    files = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True,
                                      cwd=isolated._ROOT).stdout)
    sites = [Path(p) for p in sys.path if p.endswith("site-packages")]
    for file in filter(None, files):
        site = next((s for s in sites if Path(file).is_relative_to(s)), None)
        if site is None:
            continue
        top = Path(file).relative_to(site).parts[0]
        for name in (top, f"{top}.libs"):
            source, target = site / name, into / name
            if target.exists() or not source.exists():
                continue
            if source.is_dir():
                shutil.copytree(source, target, copy_function=os.link)
            else:
                os.link(source, target)


@pytest.fixture()
def nobody_python(monkeypatch) -> Iterator[None]:
    """A Python interpreter and packages the user `nobody` can run; the model processes use them."""
    if os.geteuid() != 0:
        pytest.skip("running a model as another user needs a root server")
    linked = Path(tempfile.mkdtemp(prefix="sluice-nobody-site-"))
    linked.chmod(0o755)
    try:
        pythonpath = os.environ.get("PYTHONPATH", "")
        candidates = [(sys.executable, pythonpath)]
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        system = shutil.which(version, path="/usr/bin:/usr/local/bin")
        if system is not None:
            _linked_packages(linked)
            candidates.append((system, str(linked)))
        python, path = next(((p, s) for p, s in candidates if _runs_as_nobody(p, s)), (None, ""))
        if python is None:
            pytest.skip("no Python interpreter the user nobody may run")
        monkeypatch.setattr(isolated, "_PYTHON", python)
        monkeypatch.setenv("PYTHONPATH", path)
        yield
    finally:
        shutil.rmtree(linked, ignore_errors=True)


def test_as_nobody_the_model_cannot_signal_the_server_nor_reach_another_models_tensors(models, nobody_python):
    nobody = pwd.getpwnam("nobody")
    one = _backend(_model(models, "one"), user="nobody")
    other = _backend(_model(models, "other"), user="nobody")
    try:
        assert not isinstance(_run(other, b"other-model-secret-tensor"), InferError)
        report = _run(one, action="probe", server_pid=os.getpid(), other_pid=other._proc.pid,
                      marker="other-model-secret-tensor")
        assert psutil.Process(one._proc.pid).uids().real == nobody.pw_uid
        env = _run(one, action="env")
    finally:
        one.close()
        other.close()
    assert (report["uid"], report["gid"], report["groups"]) == (nobody.pw_uid, nobody.pw_gid, []), report
    assert report["kill"] == "PermissionError"
    assert report["reached"] == [] and not report["found"] and report["dev_shm"] == [], report
    assert env["HOME"] == nobody.pw_dir and env["USER"] == "nobody"


def test_a_model_user_is_refused_when_it_cannot_be(monkeypatch, models):
    with pytest.raises(ValueError, match="no such user"):
        sandbox.resolve_user("no-such-user-3f9a")
    with pytest.raises(ValueError, match="unprivileged user, not uid/gid 0"):
        sandbox.resolve_user("root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match=r"the server must run as root .* uid 1000"):
        sandbox.resolve_user("nobody")
    with pytest.raises(ConfigError, match="model 'refused': --python-model-user 'nobody': the server must run"):
        _backend(_model(models, "refused"), user="nobody")


async def test_with_a_model_user_every_python_model_runs_isolated_as_that_user(models, nobody_python):
    """The server's setting reaches the model: a python model that asks for no isolation runs in its own
    process as the user; one that insists on running in the server is refused."""
    _model(models, "plain")
    (models / "plain" / "config.pbtxt").write_text(CONFIG.format(name="plain"))
    manager = ModelRepositoryManager(models, limits=ClassicLimits(python_model_user="nobody"))
    await manager.start()
    try:
        result = await manager.infer("plain", None, {"X": np.array([b"x"], dtype=object)},
                                     parameters={"action": "probe", "server_pid": os.getpid(),
                                                 "other_pid": os.getpid(), "marker": "-"})
        assert json.loads(result["OUT"][0])["uid"] == pwd.getpwnam("nobody").pw_uid
    finally:
        await manager.stop()
    insists = parse_text(CONFIG.format(name="insists") + 'parameters { key: "isolation" value { string_value: '
                         '"none" } }', "test")
    with pytest.raises(ConfigError, match="'none' is refused while --python-model-user is set"):
        isolation(insists, "test", "nobody")
    assert isolation(insists, "test") == "none"
