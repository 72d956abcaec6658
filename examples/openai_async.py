"""The official OpenAI Python SDK against Sluice, asynchronously: several chats at once (the
engine batches them), then one streamed.

    python examples/openai_async.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

Also SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from openai import AsyncOpenAI

QUESTIONS = ["What is the capital of France?", "What is the capital of Italy?", "What is the capital of Spain?"]


async def ask(client: AsyncOpenAI, model: str, question: str) -> str:
    r = await client.chat.completions.create(model=model, temperature=0, max_tokens=24,
                                             messages=[{"role": "user", "content": question}])
    return r.choices[0].message.content or ""


async def main() -> None:
    p = argparse.ArgumentParser(description="Concurrent chats with Sluice through the OpenAI SDK (async).")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    client = AsyncOpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    replies = await asyncio.gather(*(ask(client, args.model, q) for q in QUESTIONS))
    for i, (question, reply) in enumerate(zip(QUESTIONS, replies, strict=True), start=1):
        print(f"reply {i}: {question} -> {reply}")

    stream = await client.chat.completions.create(
        model=args.model, temperature=0, max_tokens=24, stream=True,
        messages=[{"role": "user", "content": "Say hello in French."}])
    chunks = 0
    print("streamed: ", end="")
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            print(chunk.choices[0].delta.content, end="", flush=True)
    print(f"\nstreamed chunks: {chunks}")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
