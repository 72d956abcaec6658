"""The `SLUICE_*` variables a worker honours reach the launch through its WorkerSpec, read in one place."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from engines.launchers import ENGINES, WorkerEnvironment, add_worker_arguments, registration, spec_from_args, trtllm


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=ENGINES, required=True)
    add_worker_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_spec_carries_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLUICE_REGISTRATION_KEY", "sk-registration-secret")
    monkeypatch.setenv("SLUICE_ADMIN_KEY", "sk-admin-secret")  # never a worker's: it sends the registration key
    monkeypatch.setenv("SLUICE_VLLM_PYTHON", "/opt/vllm/bin/python")
    monkeypatch.setenv("SLUICE_TRTLLM_SERVE", "docker run trt 'trtllm-serve'")
    spec = spec_from_args(_args("--engine", "trtllm", "--model", str(tmp_path)), WorkerEnvironment.from_environ())
    assert spec.registration_key == "sk-registration-secret" and "secret" not in repr(spec)
    assert spec.python == "/opt/vllm/bin/python"
    assert trtllm.build_trtllm_argv(spec, tmp_path / "o.yaml")[:4] == ["docker", "run", "trt", "trtllm-serve"]


def test_flags_win_over_the_environment_and_nothing_is_read_unset(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    for name in ("SLUICE_REGISTRATION_KEY", "SLUICE_VLLM_PYTHON", "SLUICE_TRTLLM_SERVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLUICE_VLLM_PYTHON", "/opt/vllm/bin/python")
    env = WorkerEnvironment.from_environ()
    spec = spec_from_args(_args("--engine", "vllm", "--model", str(tmp_path), "--python", "/usr/bin/python3"), env)
    assert spec.python == "/usr/bin/python3" and spec.registration_key is None
    assert trtllm.serve_command(spec.trtllm_serve) == ["trtllm-serve"]


def test_registration_sends_the_key_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, str]] = []

    class _Ok:
        status_code = 201
        text = ""

    def post(client: Any, url: str, json: Any, headers: dict[str, str]) -> _Ok:
        sent.append(headers)
        return _Ok()

    monkeypatch.setattr("engines.launchers.registration.httpx.Client.post", post)
    monkeypatch.setenv("SLUICE_ADMIN_KEY", "from-the-environment")  # not read here: the caller passes the key
    record = registration.WorkerRecord(name="w", url="http://127.0.0.1:9")
    registration.register("http://gateway:8000", record, "sk-admin")
    registration.register("http://gateway:8000", record, None)
    assert sent == [{"Authorization": "Bearer sk-admin"}, {}]
