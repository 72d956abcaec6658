"""LangChain's ChatOpenAI pointed at Sluice with `base_url`: a call, a stream and a batch.

    python examples/langchain_chat.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

Needs `pip install langchain-openai` (pinned in requirements.txt). Also SLUICE_URL,
SLUICE_MODEL and SLUICE_API_KEY.
"""

from __future__ import annotations

import argparse
import os

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI


def main() -> None:
    p = argparse.ArgumentParser(description="Chat with Sluice through LangChain's ChatOpenAI.")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    llm = ChatOpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"),
                     model=args.model, temperature=0, max_completion_tokens=32, max_retries=0)

    reply = llm.invoke([SystemMessage("You are a concise assistant."),
                        HumanMessage("What is the capital of France?")])
    print("invoke:", reply.content)
    if reply.usage_metadata:
        print("usage:", reply.usage_metadata["input_tokens"], "input +", reply.usage_metadata["output_tokens"],
              "output tokens")

    chunks = 0
    print("stream: ", end="")
    for chunk in llm.stream("Name a primary colour."):
        if chunk.content:
            chunks += 1
            print(chunk.content, end="", flush=True)
    print(f"\nstream chunks: {chunks}")

    for question, answer in zip(["2 + 2 =", "The opposite of hot is"],
                                llm.batch(["2 + 2 =", "The opposite of hot is"]), strict=True):
        print(f"batch: {question} -> {answer.content}")


if __name__ == "__main__":
    main()
