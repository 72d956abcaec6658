"""The calibration workload: the same requests, measured the same way, on any vLLM-shaped worker.

Every request is a streamed `/v1/completions` with token ids, `ignore_eos` and
`stream_options.include_usage`, timed from sending to each SSE chunk (client side,
so a real worker's HTTP and engine-core IPC are part of what is measured):

- **cold / warm prefill**: for each prompt length, a prompt no earlier request shares
  (distinct first token), `max_tokens=1`; TTFT cold, then the same prompt again at
  once (warm: all but the last partial block, or the last block, is cached).
- **decode**: B concurrent streams of short distinct prompts; the step time is a
  stream's time from first to last chunk divided by the steps between, while all B
  are decoding (after the last first token, before the first finish); the median
  over streams.
- **mixed** (validation, not fitted): B streams decoding, then one cold prompt of L
  tokens; its TTFT and the decode gap it causes.

Requests run one measurement at a time; loops are bounded by their counts and the
per-request timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Workload:
    lengths: tuple[int, ...] = (128, 256, 384, 512, 768, 1024, 1280, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    repeats: int = 5
    decode_tokens: int = 32
    decode_prompt_tokens: int = 32
    mixed: tuple[tuple[int, int], ...] = ((8, 1024), (4, 512))  # (decoding streams, cold prompt length)
    block_size: int = 128
    seed: int = 20261201


@dataclass
class Stream:
    sent_s: float
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk that carried tokens
    cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float:
        return self.chunk_s[0] - self.sent_s


class Prompts:
    """Distinct prompts: each starts with its own token, so no two share a block."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._next_head = 1000

    def new(self, n: int) -> list[int]:
        self._next_head += 1
        return [self._next_head] + [self._rng.randrange(3000, 40000) for _ in range(n - 1)]


async def stream(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int,
                 out: Stream | None = None) -> Stream:
    """One streamed request; `out`, if given, fills in while it runs."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    out = out or Stream(0.0)
    out.sent_s = time.perf_counter()
    async with client.stream("POST", url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                out.chunk_s.append(now)
            usage = chunk.get("usage")
            if usage:
                out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return out


def _step_while_all_decode(streams: list[Stream]) -> float | None:
    """The decode step time: per stream, the time from its first to its last chunk over the steps
    between, while all B decode; the median over streams. A span, not single gaps: a client that
    falls behind reads several chunks at once, which makes gaps 0 and the next one long, while the
    span only moves by the lateness at its two ends."""
    start = max(s.chunk_s[0] for s in streams)
    stop = min(s.chunk_s[-1] for s in streams)
    spans = []
    for s in streams:
        inside = [t for t in s.chunk_s if start <= t <= stop]
        if len(inside) >= 2:
            spans.append((inside[-1] - inside[0]) / (len(inside) - 1))
    return statistics.median(spans) if spans else None


async def run_workload(url: str, model: str, w: Workload) -> dict[str, Any]:
    """Measure everything once; returns plain data (see the module docstring)."""
    prompts = Prompts(w.seed)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(3):  # warm-up: first requests pay one-off costs on a real engine
            await stream(client, url, model, prompts.new(256), 4)
        prefill = []
        for rep in range(w.repeats):
            for n in w.lengths:
                prompt = prompts.new(n)
                cold = await stream(client, url, model, prompt, 1)
                warm = await stream(client, url, model, prompt, 1)
                prefill.append({"tokens": n, "repeat": rep, "cold_ttft_s": cold.ttft_s, "warm_ttft_s": warm.ttft_s,
                                "cold_cached": cold.cached_tokens, "warm_cached": warm.cached_tokens})
        decode = []
        for rep in range(w.repeats):
            for b in w.batches:
                streams = await asyncio.gather(*(stream(client, url, model, prompts.new(w.decode_prompt_tokens),
                                                        w.decode_tokens) for _ in range(b)))
                decode.append({"batch": b, "repeat": rep, "step_s": _step_while_all_decode(list(streams))})
        mixed = [await _mixed(client, url, model, prompts, b, n, w) for b, n in w.mixed for _ in range(w.repeats)]
    return {"workload": asdict(w), "prefill": prefill, "decode": decode, "mixed": mixed}


async def _mixed(client: httpx.AsyncClient, url: str, model: str, prompts: Prompts, batch: int, n: int,
                 w: Workload) -> dict[str, Any]:
    live = [Stream(0.0) for _ in range(batch)]
    decoding = [asyncio.create_task(stream(client, url, model, prompts.new(w.decode_prompt_tokens),
                                           4 * w.decode_tokens, s)) for s in live]
    for _ in range(int(REQUEST_TIMEOUT_S / 0.01)):  # the batch is decoding before the long prompt comes
        if all(len(s.chunk_s) >= 3 for s in live):
            break
        await asyncio.sleep(0.01)
    cold = await stream(client, url, model, prompts.new(n), 1)
    streams = await asyncio.gather(*decoding)
    during = [b - a for s in streams for a, b in zip(s.chunk_s, s.chunk_s[1:], strict=False)
              if a <= cold.chunk_s[0] and b >= cold.sent_s]
    return {"batch": batch, "tokens": n, "ttft_s": cold.ttft_s, "max_gap_s": max(during) if during else None}
