"""The calibration workload: the same requests, measured the same way, on any vLLM-shaped worker.

Every request is a streamed `/v1/completions` with token ids, `ignore_eos` and
`stream_options.include_usage`, timed from sending to each SSE chunk (client side,
so a real worker's HTTP and engine-core IPC are part of what is measured):

- **cold / warm prefill**: for each prompt length, a prompt no earlier request shares
  (distinct first token), `max_tokens=1`; TTFT cold, then the same prompt again at
  once (warm: all but the last partial block, or the last block, is cached).
- **decode**: B concurrent streams of short distinct prompts; the step time is the
  mean of the worker's own ``vllm:inter_token_latency_seconds`` over them (vLLM takes
  it from the engine core's timestamps; its API server merges several steps' tokens
  into one chunk when it falls behind, so chunks do not show steps). The client's
  view (first to last chunk over the tokens between, streams whose chunks merged left
  out) is kept as ``client_step_s``. Every TTFT also has the worker's own figure
  (``*_server_ttft_s``, from ``vllm:time_to_first_token_seconds``).
- **mixed** (validation, not fitted): B streams decoding, then one cold prompt of L
  tokens; its TTFT and the decode gap it causes.

Requests run one measurement at a time; loops are bounded by their counts and the
per-request timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 600.0
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
_SAMPLE = r"^{name}_{part}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$"


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
    # Tokens in each chunk: a real server whose frontend falls behind its engine merges several
    # steps' tokens into one chunk (vLLM's output collector does), so chunks are not steps.
    chunk_tokens: list[int] = field(default_factory=list)
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
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
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
                out.chunk_tokens.append(len(chunk["choices"][0].get("token_ids") or ()) or 1)
            usage = chunk.get("usage")
            if usage:
                out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return out


async def histogram(client: httpx.AsyncClient, url: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram on the worker's /metrics, summed over label sets."""
    text = (await client.get(url + "/metrics")).text
    out = []
    for part in ("sum", "count"):
        pattern = re.compile(_SAMPLE.format(name=re.escape(name), part=part), re.M)
        out.append(sum(float(v) for v in pattern.findall(text)))
    return out[0], out[1]


async def server_mean(client: httpx.AsyncClient, url: str, name: str, before: tuple[float, float]) -> float | None:
    """Mean of the histogram's observations since `before` (the engine's own timing)."""
    total, count = await histogram(client, url, name)
    return (total - before[0]) / (count - before[1]) if count > before[1] else None


def _step_while_all_decode(streams: list[Stream]) -> float | None:
    """The decode step time: per stream, the time from its first to its last chunk over the steps
    between, while all B decode; the median over streams. A span, not single gaps: a client that
    falls behind reads several chunks at once, which makes gaps 0 and the next one long, while the
    span only moves by the lateness at its two ends. Steps are counted in tokens."""
    start = max(s.chunk_s[0] for s in streams)
    stop = min(s.chunk_s[-1] for s in streams)
    spans = []
    for s in streams:
        inside = [(t, n) for t, n in zip(s.chunk_s, s.chunk_tokens, strict=True) if start <= t <= stop]
        steps = sum(n for _, n in inside[1:])  # tokens that arrived after the span's first chunk
        # A server that merged most steps' tokens, or a client that read them in one go, shows no
        # step time: such a stream is left out rather than read as a 0 s step.
        distinct = len({round(t, 4) for t, _ in inside})
        if steps and distinct >= 0.5 * (steps + 1):
            spans.append((inside[-1][0] - inside[0][0]) / steps)
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
                row: dict[str, Any] = {"tokens": n, "repeat": rep}
                for kind in ("cold", "warm"):
                    before = await histogram(client, url, TTFT)
                    s = await stream(client, url, model, prompt, 1)
                    row |= {f"{kind}_ttft_s": s.ttft_s, f"{kind}_cached": s.cached_tokens,
                            f"{kind}_server_ttft_s": await server_mean(client, url, TTFT, before)}
                prefill.append(row)
        decode = []
        for rep in range(w.repeats):
            for b in w.batches:
                before = await histogram(client, url, ITL)
                streams = await asyncio.gather(*(stream(client, url, model, prompts.new(w.decode_prompt_tokens),
                                                        w.decode_tokens) for _ in range(b)))
                decode.append({"batch": b, "repeat": rep, "step_s": await server_mean(client, url, ITL, before),
                               "client_step_s": _step_while_all_decode(list(streams))})
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
