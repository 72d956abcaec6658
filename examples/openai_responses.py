"""OpenAI's Responses API with the official OpenAI Python SDK, as the Agents SDK and Codex speak it:
a response, a second turn through `previous_response_id` (the gateway keeps the conversation),
a stream, then the stored response read back and deleted.

    python examples/openai_responses.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

Also SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY.
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description="Talk to Sluice through the Responses API.")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    first = client.responses.create(model=args.model, instructions="Answer in one short sentence.", temperature=0,
                                    max_output_tokens=32, input="What is the capital of France?")
    print(f"first: {first.output_text}")
    second = client.responses.create(model=args.model, previous_response_id=first.id, temperature=0,
                                     max_output_tokens=32, input="And what river runs through it?")
    print(f"second: {second.output_text}")
    print(f"second turn prompt tokens: {second.usage.input_tokens} (first: {first.usage.input_tokens})")

    print("streamed: ", end="")
    with client.responses.stream(model=args.model, previous_response_id=second.id, temperature=0,
                                 max_output_tokens=24, input="Name one museum there.") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                print(event.delta, end="", flush=True)
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response
    print()
    print(f"stored: {client.responses.retrieve(final.id).output_text == final.output_text}")
    client.responses.delete(first.id)
    print("deleted the first response")


if __name__ == "__main__":
    main()
