"""The official OpenAI Python SDK against Sluice, synchronously: models, a chat, a completion.

    python examples/openai_sync.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

The URL and model can also come from SLUICE_URL and SLUICE_MODEL; set SLUICE_API_KEY when the
gateway has API keys.
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description="Chat with Sluice through the OpenAI SDK (sync).")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    print("models:", ", ".join(m.id for m in client.models.list()))

    # with_raw_response also gives the headers: X-Sluice-Worker names the worker that served it.
    raw = client.chat.completions.with_raw_response.create(
        model=args.model, temperature=0, max_tokens=32,
        messages=[{"role": "system", "content": "You are a concise assistant."},
                  {"role": "user", "content": "What is the capital of France?"}])
    chat = raw.parse()
    print("reply:", chat.choices[0].message.content)
    print("finish_reason:", chat.choices[0].finish_reason)
    if chat.usage:
        print(f"usage: {chat.usage.prompt_tokens} prompt + {chat.usage.completion_tokens} completion tokens")
    print("worker:", raw.headers.get("x-sluice-worker"))

    completion = client.completions.create(model=args.model, prompt="The capital of Italy is", max_tokens=8,
                                           temperature=0)
    print("completion:", completion.choices[0].text)


if __name__ == "__main__":
    main()
