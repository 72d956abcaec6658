"""Streaming with the official OpenAI Python SDK: tokens as they arrive, time to first token,
and the usage chunk (with the prompt tokens the engine had cached, where it reports them).

    python examples/openai_stream.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

Also SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY.
"""

from __future__ import annotations

import argparse
import os
import time

from openai import OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description="Stream a chat from Sluice through the OpenAI SDK.")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    p.add_argument("--max-tokens", type=int, default=48)
    args = p.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    t0 = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    stream = client.chat.completions.create(
        model=args.model, temperature=0, max_tokens=args.max_tokens, stream=True,
        stream_options={"include_usage": True},  # one last chunk with no choices and the usage
        messages=[{"role": "user", "content": "Write a haiku about rivers."}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            chunks += 1
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            usage = chunk.usage
    print()
    if first is not None:
        print(f"time to first token: {first - t0:.2f} s")
    print(f"chunks: {chunks}")
    if usage:
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details else None
        print(f"usage: {usage.prompt_tokens} prompt ({cached if cached is not None else 'unreported'} cached) + "
              f"{usage.completion_tokens} completion tokens")


if __name__ == "__main__":
    main()
