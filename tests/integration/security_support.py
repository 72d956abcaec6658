"""Helpers for the access-control and quota tests: a small repository, a keys file, clients with keys.

The repository holds the default LLM (for token quotas), `add_sub` (a light
classic model for the KServe and gRPC shapes) and `gated`, a python model whose
executions wait while `<gate>/closed` exists: a request that holds a concurrency
slot for exactly as long as a test wants, without timing anything.
"""

from __future__ import annotations

import secrets
import shutil
import socket
from pathlib import Path

import httpx
import openai
import yaml

from tests.integration.kserve_support import ADD_SUB_CONFIG, ADD_SUB_PY, GATED_CONFIG, GATED_PY, wait_for
from tests.servers import DEFAULT_REPO, Server, llm_only_repository

EMBEDDINGS = "all-minilm-l6-v2"


def new_key(tag: str) -> str:
    return f"sk-{tag}-{secrets.token_hex(12)}"


def _write_model(model_dir: Path, config: str, model_py: str) -> None:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    (model_dir / "1" / "model.py").write_text(model_py)


def secured_repository(tmp: Path, *, llm: bool = True, embeddings: bool = False) -> tuple[Path, Path]:
    """(repository, gate directory)."""
    if llm:
        repo = llm_only_repository(tmp)
    else:
        repo = tmp / "repo"
        repo.mkdir(parents=True)
    gate = tmp / "gate"
    gate.mkdir()
    _write_model(repo / "add_sub", ADD_SUB_CONFIG, ADD_SUB_PY)
    _write_model(repo / "gated", GATED_CONFIG.format(name="gated", policy="max_queue_size: 8", gate=gate), GATED_PY)
    if embeddings:
        shutil.copytree(DEFAULT_REPO / EMBEDDINGS, repo / EMBEDDINGS, ignore=shutil.ignore_patterns("__pycache__"))
    return repo, gate


def write_keys(path: Path, keys: dict[str, tuple[str, dict[str, int]]]) -> Path:
    """keys: id -> (key, limits)."""
    path.write_text(yaml.safe_dump([{"id": kid, "key": key, **limits} for kid, (key, limits) in keys.items()]))
    return path


def sdk(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # lower case: gRPC metadata keys must be


def metrics(server: Server, key: str | None = None) -> str:
    r = httpx.get(server.url + "/metrics", headers=bearer(key) if key else {})
    assert r.status_code == 200, r.text
    return r.text


def close_gate(gate: Path) -> None:
    for f in gate.glob("started-*"):
        f.unlink()
    (gate / "closed").touch()


def wait_started(gate: Path) -> None:
    wait_for(lambda: any(gate.glob("started-*")), "the gated model to start executing")


def open_gate(gate: Path) -> None:
    (gate / "closed").unlink(missing_ok=True)


def non_loopback_address() -> str | None:
    """This machine's address on its default route, or None when it has only loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address
