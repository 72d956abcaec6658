"""Servers the tests under tests/gateway share. Package-scoped: each holds the default LLM in-process
(about 2 GB), so they stop when tests/gateway is done rather than living on beside the integration
suite's vLLM workers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import DEFAULT_REPO, Server, llm_only_repository, start_server


@pytest.fixture(scope="package")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The gateway with the default LLM on the in-process transformers engine."""
    tmp = tmp_path_factory.mktemp("llm")
    repo = llm_only_repository(tmp)
    server = start_server(["--model-repository", str(repo)], tmp / "server.log", grpc=True)
    yield server
    server.stop()


@pytest.fixture(scope="package")
def full_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default LLM plus a classic model (digits_onnx), HTTP and gRPC: what a hostile
    client can reach, and what must still answer after every refusal."""
    tmp = tmp_path_factory.mktemp("full")
    repo = llm_only_repository(tmp)
    shutil.copytree(DEFAULT_REPO / "digits_onnx", repo / "digits_onnx")
    server = start_server(["--model-repository", str(repo)], tmp / "server.log", grpc=True)
    yield server
    server.stop()


@pytest.fixture(scope="package")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One running slot, one queue place, a small body limit and fast pings."""
    tmp = tmp_path_factory.mktemp("tight")
    repo = llm_only_repository(tmp)
    server = start_server(
        ["--model-repository", str(repo), "--max-running", "1", "--max-queued", "1",
         "--max-body-bytes", "4096"],
        tmp / "server.log", env={"SLUICE_SSE_PING_S": "0.2"},
    )
    yield server
    server.stop()


@pytest.fixture()
def repo_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "model_repository"
