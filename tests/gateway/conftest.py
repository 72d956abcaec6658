from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Server, llm_only_repository, start_server


@pytest.fixture(scope="session")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The gateway with the default LLM on the in-process transformers engine."""
    tmp = tmp_path_factory.mktemp("llm")
    repo = llm_only_repository(tmp)
    server = start_server(["--model-repository", str(repo)], tmp / "server.log", grpc=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
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
