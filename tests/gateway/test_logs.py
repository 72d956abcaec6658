"""`--log-format json`: one JSON object per line, the access record carries the request id,
route, status, worker and timings, and never the prompt or the completion."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.servers import LLM_NAME, llm_only_repository, start_server

pytestmark = pytest.mark.integration


def test_json_access_records(tmp_path: Path) -> None:
    server = start_server(["--model-repository", str(llm_only_repository(tmp_path)), "--log-format", "json"],
                          tmp_path / "server.log")
    marker = "quokka-lantern-5521"
    try:
        r = httpx.post(server.url + "/v1/chat/completions", timeout=120, headers={"X-Request-Id": "rid-json-1"},
                       json={"model": LLM_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": marker}]})
        assert r.status_code == 200
        completion = r.json()["choices"][0]["message"]["content"]
    finally:
        server.stop()
    records = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert records and all({"ts", "level", "logger", "message"} <= set(rec) for rec in records)
    access = [rec for rec in records if rec.get("request_id") == "rid-json-1"]
    assert len(access) == 1
    rec = access[0]
    assert (rec["route"], rec["status"], rec["worker"], rec["model"]) == ("/v1/chat/completions", 200, "local",
                                                                          LLM_NAME)
    assert rec["duration_ms"] >= rec["ttfb_ms"] > 0 and rec["body_bytes"] > 0
    assert marker not in server.log() and (not completion.strip() or completion not in server.log())
