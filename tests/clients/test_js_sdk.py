"""The official `openai` npm package, run by Node, against a live gateway: it lists the models
and streams a chat (tests/js/openai_sdk.mjs; the package comes from scripts/ensure_npm.sh)."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest

from tests.servers import LLM_NAME, ROOT, Server

pytestmark = pytest.mark.integration

JS = ROOT / "tests" / "js"
PROMPT = "Name three colours."


def test_openai_npm_package_lists_models_and_streams_a_chat(ui_server: Server) -> None:
    node = shutil.which("node")
    assert node, "node is missing: run scripts/ensure_apt.sh (make apt)"
    assert (JS / "node_modules" / "openai" / "package.json").exists(), "run scripts/ensure_npm.sh (make npm)"
    out = subprocess.run([node, str(JS / "openai_sdk.mjs"), ui_server.url + "/v1", LLM_NAME, PROMPT],
                         capture_output=True, text=True, timeout=300, cwd=JS)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["models"] == [LLM_NAME]
    # Greedy: the SDK's streamed text is what the server answers to the same request unstreamed.
    same = httpx.post(ui_server.url + "/v1/chat/completions", timeout=120, json={
        "model": LLM_NAME, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 12})
    assert result["text"] == same.json()["choices"][0]["message"]["content"] != ""
    assert result["contentChunks"] > 1
    assert result["usage"]["completion_tokens"] == same.json()["usage"]["completion_tokens"]
    assert result["worker"] == "local"
