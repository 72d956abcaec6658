"""examples/openai_tools_vllm.py against the gateway in front of real vLLM workers (hermes tool
parser on): the tool call comes from vLLM's parser and the script completes the loop."""

from __future__ import annotations

import json
import re

import pytest

from tests.clients.scripts import run_example
from tests.integration.conftest import MODEL
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_tool_call_example(gateway: Server) -> None:
    # The tiny model has random weights: --force-tool-call makes its first reply a hermes call.
    out = run_example("openai_tools_vllm.py", "--url", gateway.url, "--model", MODEL, "--force-tool-call")
    assert "finish_reason: tool_calls" in out
    call = re.search(r"^tool call: get_weather\((.*)\) id=(\S+)$", out, re.M)
    assert call and json.loads(call.group(1)) == {"city": "Paris"}
    assert json.loads(re.search(r"^tool result: (.*)$", out, re.M).group(1))["city"] == "Paris"  # type: ignore[union-attr]
    assert re.search(r"^final answer: ", out, re.M)


def test_tool_call_example_without_a_call(gateway: Server) -> None:
    # Left to itself the random model (greedy) writes no tool call: the script says so and stops.
    out = run_example("openai_tools_vllm.py", "--url", gateway.url, "--model", MODEL)
    assert "finish_reason: tool_calls" not in out and re.search(r"^no tool call; reply: ", out, re.M)
