"""A worker's key and bind address: read from a file or the environment, refused when missing on a
reachable host, handed to vLLM through its environment only, and every KV socket on --host."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engines.launchers import ENGINES, WorkerEnvironment, add_worker_arguments, spec_from_args, vllm, worker_guard
from engines.launchers.spec import read_worker_key

KEY = "k" * 20 + "-0123456789abcdef"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=ENGINES, required=True)
    add_worker_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_key_comes_from_the_file_first_then_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    assert read_worker_key(path, "another-key-from-the-env") == KEY
    assert read_worker_key(None, KEY) == KEY
    assert read_worker_key(None, None) is None and read_worker_key(None, "") is None


@pytest.mark.parametrize("bad", ["short", "has a space in it!!", "comma,separated,key,x", "é" * 20])
def test_a_weak_or_malformed_key_is_refused_without_quoting_it(bad: str) -> None:
    with pytest.raises(ValueError, match="at least 16 printable ASCII") as e:
        read_worker_key(None, bad)
    assert bad not in str(e.value)


def test_an_unreadable_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the worker key file"):
        read_worker_key(tmp_path / "missing", None)


def test_a_reachable_host_without_a_key_is_refused_unless_allowed(tmp_path: Path) -> None:
    env = WorkerEnvironment()
    with pytest.raises(ValueError, match=r"--host 10\.1\.2\.3 lets other machines reach this worker"):
        spec_from_args(_args("--engine", "vllm", "--model", str(tmp_path), "--host", "10.1.2.3"), env)
    allowed = _args("--engine", "vllm", "--model", str(tmp_path), "--host", "10.1.2.3", "--allow-unauthenticated")
    assert spec_from_args(allowed, env).worker_key is None
    keyed = spec_from_args(_args("--engine", "vllm", "--model", str(tmp_path), "--host", "10.1.2.3"),
                           WorkerEnvironment(worker_key=KEY))
    assert keyed.worker_key == KEY and KEY not in repr(keyed)
    assert spec_from_args(_args("--engine", "vllm", "--model", str(tmp_path)), env).host == "127.0.0.1"


def test_a_reachable_trtllm_worker_is_refused_even_with_a_key(tmp_path: Path) -> None:
    """trtllm-serve does not check the worker key, so a key does not make a reachable TensorRT-LLM
    worker safe: only --allow-unauthenticated (the port restricted by a NetworkPolicy) starts it."""
    keyed = WorkerEnvironment(worker_key=KEY)
    reachable = ("--engine", "trtllm", "--model", str(tmp_path), "--host", "10.1.2.3")
    with pytest.raises(ValueError, match="trtllm-serve does not check the worker key") as e:
        spec_from_args(_args(*reachable), keyed)
    assert "NetworkPolicy" in str(e.value) and KEY not in str(e.value)
    assert spec_from_args(_args(*reachable, "--allow-unauthenticated"), keyed).worker_key == KEY
    assert spec_from_args(_args("--engine", "trtllm", "--model", str(tmp_path)), keyed).host == "127.0.0.1"


def test_vllm_binds_its_kv_sockets_on_the_host_and_gets_the_key_from_its_environment(tmp_path: Path) -> None:
    spec = spec_from_args(_args("--engine", "vllm", "--model", str(tmp_path), "--port", "8100"),
                          WorkerEnvironment(worker_key=KEY))
    launch = vllm.build_vllm_launch(spec, "python3", cpu=True, guard_dir=vllm.install_guard(tmp_path))
    config = json.loads(launch.argv[launch.argv.index("--kv-events-config") + 1])
    assert (config["endpoint"], config["replay_endpoint"]) == ("tcp://[::ffff:127.0.0.1]:9100", "tcp://127.0.0.1:9101")
    assert KEY not in " ".join(launch.argv) and "--api-key" not in launch.argv
    assert launch.env["VLLM_API_KEY"] == KEY
    assert launch.argv[launch.argv.index("--middleware") + 1] == "sluice_worker_guard.WorkerKeyGuard"
    assert launch.env["PYTHONPATH"].split(":")[0] == str(tmp_path)
    assert (tmp_path / "sluice_worker_guard.py").read_text() == Path(worker_guard.__file__).read_text()


def test_kv_bind_endpoints() -> None:
    assert vllm.kv_bind_endpoints("10.0.0.7", 9100) == ("tcp://[::ffff:10.0.0.7]:9100", "tcp://10.0.0.7:9101")
    assert vllm.kv_bind_endpoints("localhost", 9100) == ("tcp://[::ffff:127.0.0.1]:9100", "tcp://127.0.0.1:9101")
    assert vllm.kv_bind_endpoints("0.0.0.0", 9100) == ("tcp://*:9100", "tcp://*:9101")  # asked for explicitly
    with pytest.raises(ValueError, match="cannot bind an IPv6 address"):
        vllm.kv_bind_endpoints("::1", 9100)


def _call(guard: worker_guard.WorkerKeyGuard, path: str, authorization: str | None) -> tuple[int, bytes]:
    headers = [(b"authorization", authorization.encode())] if authorization is not None else []
    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    guard.app = app
    asyncio.run(guard({"type": "http", "method": "POST", "path": path, "headers": headers}, receive, send))
    return sent[0]["status"], sent[1]["body"]


def test_the_guard_opens_only_the_probes_to_callers_without_the_key() -> None:
    guard = worker_guard.WorkerKeyGuard(None, KEY)  # type: ignore[arg-type]
    for path in ("/v1/completions", "/invocations", "/tokenize", "/kv_event_sources", "/"):
        for authorization in (None, "Bearer wrong", f"Basic {KEY}", "Bearer ", KEY):
            status, body = _call(guard, path, authorization)
            assert status == 401 and KEY.encode() not in body, (path, authorization)
            assert json.loads(body)["error"]["code"] == "invalid_worker_key"
        assert _call(guard, path, f"Bearer {KEY}") == (200, b"ok")
        assert _call(guard, path, f"bearer  {KEY} ") == (200, b"ok")
    for path in ("/health", "/metrics"):
        assert _call(guard, path, None) == (200, b"ok")
    assert _call(worker_guard.WorkerKeyGuard(None, ""), "/v1/completions", None) == (200, b"ok")  # type: ignore[arg-type]
