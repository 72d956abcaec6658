"""Workload generators for routing experiments, live or in virtual time.

A workload is an iterable of `Request`s in arrival order. Each has an arrival time (seconds from
the start), either chat `messages` or a text `prompt` (for /v1/completions), `max_tokens`, and a
session id. Text is built from `Vocab`: words that are each exactly one token of the model's
tokenizer, so a text of n words is n tokens, and texts that share a word prefix share that token
prefix (`Vocab.check` verifies it on the real tokenizer). Nothing here does I/O or reads a clock:
the same seed gives the same requests, so policies are compared on identical traffic.

    from loadtests.routing.live_workloads import WORKLOADS, Vocab
    vocab = Vocab.from_tokenizer(tokenizer)
    for req in WORKLOADS["chat"](vocab, rate=2.0, duration_s=30, seed=1):
        ...

Generators (`rate` is requests per second, arrivals Poisson unless the trace says otherwise):

- `chat`: multi-turn conversations opening with one of `system_prompts` shared system prompts;
  each conversation's turns follow each other after a think time; every turn re-sends the
  history (the assistant turns are the workload's own text, so prompts are known in advance).
- `docqa`: long-document QA: questions against a pool of long documents, popular ones more often.
- `agentic`: agent loops whose context grows every step by a tool result.
- `skewed`: `chat`, but one system-prompt group carries half of the conversations.
- `nosharing`: every prompt is distinct (the control: no policy can find a hit).
- `mooncake`: a scaled-down replay of the Mooncake trace: whole prefix families sampled, the
  17 minutes compressed into `duration_s`, each 512-token hash id expanded to
  `tokens_per_block` fixed words.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE = Path("/work/shared/traces/mooncake_synthetic_trace.jsonl")


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    max_tokens: int
    session: str
    messages: tuple[dict[str, str], ...] | None = None  # chat
    prompt: str | None = None  # completions (text; `Vocab` words, one token each)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


class Vocab:
    """Single-token words of a tokenizer (space-prefixed, letters only), to build texts of known length."""

    def __init__(self, words: list[str]) -> None:
        if len(words) < 1000:
            raise ValueError("need at least 1000 single-token words")
        self.words = words

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, limit: int = 20000) -> Vocab:
        words = []
        for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            if token.startswith("Ġ") and token[1:].isascii() and token[1:].isalpha() and len(token) > 3:
                words.append(" " + token[1:])
            if len(words) >= limit:
                break
        return cls(words)

    def text(self, rng: random.Random, n_tokens: int) -> str:
        return "".join(rng.choice(self.words) for _ in range(n_tokens))

    def block(self, key: int, n_tokens: int) -> str:
        """The fixed text of one trace block: the same key always gives the same words."""
        rng = random.Random(key * 1_000_003 + 17)
        return self.text(rng, n_tokens)

    def check(self, tokenizer: Any, samples: int = 20, seed: int = 0) -> float:
        """The share of sampled texts whose token count equals their word count."""
        rng = random.Random(seed)
        ok = 0
        for _ in range(samples):
            n = rng.randrange(50, 400)
            ok += len(tokenizer.encode(self.text(rng, n), add_special_tokens=False)) == n
        return ok / samples


def _arrivals(rng: random.Random, rate: float, duration_s: float) -> Iterator[float]:
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return
        yield t


def _conversations(vocab: Vocab, *, rate: float, duration_s: float, seed: int, groups: list[str],
                   group_weights: list[float], turns: int, user_tokens: int, answer_tokens: int,
                   think_s: float, max_tokens: int, opening_tokens: int, tag: str) -> list[Request]:
    """Conversations start at `rate`/turns per second; each sends `turns` requests."""
    rng = random.Random(seed)
    out: list[Request] = []
    for c, start in enumerate(_arrivals(rng, rate / turns, duration_s)):
        g = rng.choices(range(len(groups)), group_weights)[0]
        history: list[dict[str, str]] = [{"role": "system", "content": groups[g]},
                                         {"role": "user", "content": vocab.text(rng, opening_tokens)}]
        t = start
        for turn in range(turns):
            if t >= duration_s:
                break
            out.append(Request(t, max_tokens, f"{tag}-{c}", tuple(history), meta={"group": g, "turn": turn}))
            history = [*history, {"role": "assistant", "content": vocab.text(rng, answer_tokens)},
                       {"role": "user", "content": vocab.text(rng, user_tokens)}]
            t += rng.expovariate(1.0 / think_s)
    return sorted(out, key=lambda r: r.arrival_s)


def chat(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, *, system_prompts: int = 4,
         system_tokens: int = 1024, turns: int = 4, max_tokens: int = 16, skew: float | None = None) -> list[Request]:
    rng = random.Random(seed + 101)
    groups = [vocab.text(rng, system_tokens) for _ in range(system_prompts)]
    weights = [1.0] * system_prompts
    if skew is not None:  # one group carries `skew` of the conversations
        weights = [skew] + [(1 - skew) / (system_prompts - 1)] * (system_prompts - 1)
    return _conversations(vocab, rate=rate, duration_s=duration_s, seed=seed, groups=groups, group_weights=weights,
                          turns=turns, user_tokens=48, answer_tokens=96, think_s=3.0, max_tokens=max_tokens,
                          opening_tokens=128, tag="chat")


def skewed(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, **kw: Any) -> list[Request]:
    return chat(vocab, rate, duration_s, seed, system_prompts=kw.pop("system_prompts", 8), skew=0.5, **kw)


def docqa(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, *, documents: int = 24,
          doc_tokens: int = 3072, max_tokens: int = 16, zipf_s: float = 1.1) -> list[Request]:
    rng = random.Random(seed + 202)
    docs = [vocab.text(rng, doc_tokens) for _ in range(documents)]
    weights = [1.0 / (i + 1) ** zipf_s for i in range(documents)]
    out = []
    for i, t in enumerate(_arrivals(rng, rate, duration_s)):
        d = rng.choices(range(documents), weights)[0]
        msgs = ({"role": "system", "content": "Answer from the document."},
                {"role": "user", "content": docs[d] + "\nQuestion:" + vocab.text(rng, 32)})
        out.append(Request(t, max_tokens, f"doc-{i}", msgs, meta={"doc": d}))
    return out


def agentic(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, *, steps: int = 8,
            tool_tokens: int = 256, max_tokens: int = 16, task_tokens: int = 512) -> list[Request]:
    """Agent loops: a shared tool-use preamble, a task, then each step appends a call and its result."""
    rng = random.Random(seed + 303)
    preamble = vocab.text(rng, 768)
    out: list[Request] = []
    for a, start in enumerate(_arrivals(rng, rate / steps, duration_s)):
        history = [{"role": "system", "content": preamble}, {"role": "user", "content": vocab.text(rng, task_tokens)}]
        t = start
        for step in range(steps):
            if t >= duration_s:
                break
            out.append(Request(t, max_tokens, f"agent-{a}", tuple(history), meta={"step": step}))
            history = [*history, {"role": "assistant", "content": vocab.text(rng, 32)},
                       {"role": "user", "content": "Tool result:" + vocab.text(rng, tool_tokens)}]
            t += rng.expovariate(1.0 / 0.8)  # tools are quick: the loop comes back soon
    return sorted(out, key=lambda r: r.arrival_s)


def nosharing(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, *, prompt_tokens: int = 1024,
              max_tokens: int = 16) -> list[Request]:
    rng = random.Random(seed + 404)
    return [Request(t, max_tokens, f"solo-{i}", ({"role": "user", "content": vocab.text(rng, prompt_tokens)},))
            for i, t in enumerate(_arrivals(rng, rate, duration_s))]


def mooncake(vocab: Vocab, rate: float, duration_s: float, seed: int = 1, *, tokens_per_block: int = 32,
             max_tokens: int = 16, max_prompt_tokens: int = 8000, trace: Path = TRACE) -> list[Request]:
    """A scaled-down replay of the Mooncake trace: `rate × duration_s` of its requests, in its order.

    Prefix reuse needs the first block to match, so the trace is sampled by *family* (requests
    with the same first hash id): whole families are kept (seeded) until the count is reached,
    which keeps every reuse within them; the 17 minutes are compressed into `duration_s`. Each
    512-token hash id becomes `tokens_per_block` fixed words (the same id, the same words), the
    prompt cut to input_length scaled by the same factor, and at `max_prompt_tokens`."""
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    families: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        families.setdefault(row["hash_ids"][0], []).append(row)
    order = list(families)
    random.Random(seed + 505).shuffle(order)
    want = max(1, round(rate * duration_s))
    kept: list[dict[str, Any]] = []
    for first in order:
        if len(kept) >= want:
            break
        kept.extend(families[first])
    kept.sort(key=lambda r: r["timestamp"])
    span_s = max(1e-9, (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0)
    scale = tokens_per_block / 512
    out = []
    for row in kept:
        t = (row["timestamp"] - rows[0]["timestamp"]) / 1000.0 / span_s * duration_s
        n = min(max_prompt_tokens, max(1, math.ceil(row["input_length"] * scale)))
        text = "".join(vocab.block(h, tokens_per_block) for h in row["hash_ids"])
        out.append(Request(t, max_tokens, f"mc-{row['hash_ids'][0]}", prompt=_cut_words(text, n),
                           meta={"trace_input_length": row["input_length"]}))
    return out


def _cut_words(text: str, n: int) -> str:
    """The first `n` words (tokens) of a `Vocab` text."""
    parts = text.split(" ")  # text starts with a space: parts[0] == ""
    return "".join(" " + w for w in parts[1 : n + 1])


Workload = Callable[..., list[Request]]
WORKLOADS: dict[str, Workload] = {"chat": chat, "docqa": docqa, "agentic": agentic, "skewed": skewed,
                                  "nosharing": nosharing, "mooncake": mooncake}
