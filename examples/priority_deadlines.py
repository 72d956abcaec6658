"""Priority classes and TTFT deadlines with the official OpenAI Python SDK.

    python examples/priority_deadlines.py [--url http://127.0.0.1:8000] [--model smollm2-135m-instruct]

A chat in the `interactive` class with a time-to-first-token deadline: the gateway admits it ahead
of standard and batch work and says the TTFT it predicted (`X-Sluice-Predicted-TTFT-Ms`). A class
the server does not know is refused with OpenAI's error JSON. Then the per-tenant series this
left in /metrics. SLUICE_URL, SLUICE_MODEL and SLUICE_API_KEY work as in the other examples; with
API keys, the key's `max_priority` must allow `interactive`.
"""

from __future__ import annotations

import argparse
import os

import httpx
from openai import BadRequestError, OpenAI


def main() -> None:
    p = argparse.ArgumentParser(description="Priority and deadlines through Sluice (OpenAI SDK).")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--model", default=os.environ.get("SLUICE_MODEL", "smollm2-135m-instruct"))
    args = p.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=os.environ.get("SLUICE_API_KEY", "unused"))

    raw = client.chat.completions.with_raw_response.create(
        model=args.model, temperature=0, max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_headers={"X-Sluice-Priority": "interactive", "X-Sluice-TTFT-Deadline-Ms": "30000"})
    print("reply:", raw.parse().choices[0].message.content)
    print("predicted ttft ms:", raw.headers.get("x-sluice-predicted-ttft-ms"))

    try:
        client.chat.completions.create(model=args.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"X-Sluice-Priority": "urgent"})
    except BadRequestError as e:
        print("unknown class:", e.status_code, e.code)

    metrics = httpx.get(args.url.rstrip("/") + "/metrics").text
    for line in metrics.splitlines():
        if line.startswith(("sluice_tenant_admitted_total", "sluice_llm_deadline_requests_total")):
            print("metric:", line)


if __name__ == "__main__":
    main()
