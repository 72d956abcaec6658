"""Tool calls through Sluice to a vLLM worker, with the official OpenAI Python SDK.

The gateway forwards chat requests to the worker's own /v1/chat/completions, so the tool
calls come from vLLM's tool parser. Start the worker with it turned on, e.g.

    sluice worker --engine vllm --model smollm2-135m-instruct --served-model-name smollm2-vllm \\
        --port 8100 --gateway http://127.0.0.1:8000 -- --enable-auto-tool-choice --tool-call-parser hermes

then run

    python examples/openai_tools_vllm.py [--url http://127.0.0.1:8000] [--model smollm2-vllm]

The script offers a weather tool, runs the call the model makes, sends the result back and
prints the final answer. `--force-tool-call` makes the first reply a hermes tool call with
vLLM's structured outputs (a vLLM extra the gateway forwards), for models too small or too
random to call tools on their own; vLLM's parser still turns that text into `tool_calls`.
Also SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from openai import OpenAI

WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}}}
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "sky": "sunny", "temperature_c": 21}


def main() -> None:
    p = argparse.ArgumentParser(description="Tool calls via Sluice to a vLLM worker (hermes parser).")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-vllm"))
    p.add_argument("--force-tool-call", action="store_true", help="constrain the first reply to a hermes tool call")
    args = p.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    extra = {"structured_outputs": {"choice": [HERMES_CALL]}} if args.force_tool_call else {}
    first = client.chat.completions.create(model=args.model, messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice="auto", temperature=0, max_tokens=64, extra_body=extra)
    choice = first.choices[0]
    print("finish_reason:", choice.finish_reason)
    if not choice.message.tool_calls:
        print("no tool call; reply:", choice.message.content)
        return
    messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in choice.message.tool_calls]})
    for call in choice.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        print(f"tool call: {call.function.name}({json.dumps(arguments)}) id={call.id}")
        result = get_weather(**arguments)
        print("tool result:", json.dumps(result))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})

    final = client.chat.completions.create(model=args.model, messages=messages, tools=[WEATHER_TOOL],
                                           temperature=0, max_tokens=32)
    print("final answer:", final.choices[0].message.content)


if __name__ == "__main__":
    main()
