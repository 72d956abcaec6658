"""Prefix-affinity routing over two real vLLM workers (issue 4).

Eight multi-turn conversations share one long system prompt. They run
concurrently (turns in order within each), so the router's load terms spread
new conversations over both workers; the conversations' own history then keeps
each on its worker. The router's per-request prediction (response header) is
checked against the cached tokens the engine reports.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.integration.conftest import BLOCK, MODEL, Worker
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.slow]

CONVERSATIONS = 8
TURNS = 4
ANSWER_TOKENS = 8

# Shared by every conversation; > 2 blocks once the chat template is applied (checked below).
SYSTEM = " ".join(
    f"Rule {i}: when the harbour master of port {i} asks about tides, cargo manifests or the weather "
    f"near lighthouse {i}, answer in one short sentence and never invent numbers." for i in range(1, 13))

TOPICS = ["glaciers", "violins", "tax law", "beekeeping", "compilers", "sourdough", "volcanoes", "chess"]


def _document(i: int) -> str:
    """A conversation-specific opening message of about one block, so that each
    conversation owns cache blocks that only its own worker holds."""
    topic = TOPICS[i]
    return " ".join(f"Note {k} on {topic}: item {k * 7 + i} of the {topic} file says {topic} matter to "
                    f"reader {i}." for k in range(8)) + f" Summarise what you know about {topic}."


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    worker: str
    reason: str
    predicted_cached: int
    reported_cached: int


def _client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


async def _chat(client: openai.AsyncOpenAI, messages: list[dict[str, str]], conversation: int,
                turn: int) -> tuple[Turn, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=ANSWER_TOKENS,
        extra_body={"ignore_eos": True})
    completion = raw.parse()
    details = completion.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None, completion.usage
    record = Turn(conversation, turn, raw.headers["x-sluice-worker"], raw.headers["x-sluice-route-reason"],
                  int(raw.headers["x-sluice-predicted-cached-tokens"]), details.cached_tokens)
    return record, completion.choices[0].message.content or ""


async def _conversation(client: openai.AsyncOpenAI, i: int) -> list[Turn]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _document(i)}]
    turns = []
    for t in range(TURNS):
        record, answer = await _chat(client, messages, i, t)
        turns.append(record)
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"Question {t + 1} about {TOPICS[i]}: go on, please."}]
    return turns


async def test_conversations_stick_to_their_worker_and_predictions_match(
        gateway: Server, workers: list[Worker]) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        tok = (await http.post(gateway.url + "/tokenize", json={
            "model": MODEL, "messages": [{"role": "system", "content": SYSTEM}],
            "add_generation_prompt": False})).json()
    assert tok["count"] > 2 * BLOCK, tok["count"]

    client = _client(gateway)
    conversations = await asyncio.gather(*(_conversation(client, i) for i in range(CONVERSATIONS)))
    turns = [t for conv in conversations for t in conv]
    table = "\n".join(str(t) for t in turns)

    # Affinity: a later turn runs on a worker that already served its conversation
    # (and so holds its cache), unless the router left such a worker because of load.
    moved, stayed = [], []
    for conv in conversations:
        for k, cur in enumerate(conv[1:], start=1):
            if cur.worker in {t.worker for t in conv[:k]}:
                stayed.append(cur)
            elif cur.reason != "load":
                moved.append(cur)
    assert not moved, f"turns left their conversation's worker without a load reason:\n{table}"
    # Those turns really reuse the conversation's cache: the system prompt and its own opening.
    assert stayed and all(t.reported_cached >= 4 * BLOCK for t in stayed), table

    # Closed loop: prediction within one block of what the engine reported.
    within = [t for t in turns if abs(t.predicted_cached - t.reported_cached) <= BLOCK]
    assert len(within) >= 0.9 * len(turns), f"{len(within)}/{len(turns)} within one block:\n{table}"

    # Whether load spreads these conversations over both workers is not asserted: the cost in
    # seconds keeps a shared prefix on its holder until that worker's queue costs more than a cold
    # prefill elsewhere, which a quiet machine may never reach here. Spread is measured where load
    # is controlled: the imbalance figures of loadtests/routing/bench_vtime.py (docs/routing.md).
