"""Anthropic's Messages API with the official `anthropic` Python SDK, as Claude Code and agent
tools speak it: count the prompt's tokens, one message, then a stream of the next turn.

    python examples/anthropic_messages.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

Also SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY (sent as `x-api-key`, as the SDK does).
"""

from __future__ import annotations

import argparse
import os

import anthropic


def main() -> None:
    p = argparse.ArgumentParser(description="Talk to Sluice through the Anthropic SDK.")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    client = anthropic.Anthropic(base_url=args.url.rstrip("/"), api_key=os.environ.get("SLUICE_API_KEY", "unused"))
    greedy = {"temperature": 0}  # current SDKs send sampling fields through extra_body
    system = "You are a concise geography tutor."
    turns = [{"role": "user", "content": "What is the capital of France?"}]

    counted = client.messages.count_tokens(model=args.model, system=system, messages=turns)
    print(f"prompt tokens: {counted.input_tokens}")
    reply = client.messages.create(model=args.model, max_tokens=32, system=system, messages=turns,
                                   extra_body=greedy)
    print(f"reply: {reply.content[0].text}")
    print(f"stop reason: {reply.stop_reason}")
    print(f"usage: {reply.usage.input_tokens} input + {reply.usage.cache_read_input_tokens or 0} cached + "
          f"{reply.usage.output_tokens} output tokens")

    turns += [{"role": "assistant", "content": reply.content[0].text},
              {"role": "user", "content": "And of Italy?"}]
    with client.messages.stream(model=args.model, max_tokens=32, system=system, messages=turns,
                                extra_body=greedy) as stream:
        print("streamed: ", end="")
        for text in stream.text_stream:
            print(text, end="", flush=True)
        print()
        final = stream.get_final_message()
    print(f"streamed stop reason: {final.stop_reason}")


if __name__ == "__main__":
    main()
