"""Synthetic routing workloads, each a list of `Session`s, deterministic for a seed.

Every workload takes the mean request rate (requests/s over the whole fleet) and
the number of requests it should have (about: closed-loop sessions draw their
turn counts), and draws sessions as a seeded Poisson process:

- `chat`: multi-turn conversations, each opening with one of a few shared system
  prompts; every turn carries the whole history (earlier answers included) plus
  a new user message, after a think time.
- `docqa`: many one-turn questions over a few long documents.
- `agentic`: agent loops whose context grows with every tool call (the model's
  action and the tool's result are appended; the next call follows the tool's
  latency).
- `skewed`: `chat` over many system prompts, one of which opens half the conversations.
- `nosharing`: unique prompts, the control where no cache can help.

Token ids are random (numpy, seeded by what they stand for), so two runs of the
same workload send the same prompts whatever the policy; only a closed-loop
session's timing depends on how fast it is served.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from loadtests.routing.vtime.sessions import NextTurn, Session, Turn, turns_of

VOCAB = 32000


def tokens(key: str, n: int) -> list[int]:
    """`n` token ids that only depend on `key`."""
    seed = xxhash.xxh64_intdigest(key.encode())
    out: list[int] = np.random.default_rng(seed).integers(1, VOCAB, n).tolist()
    return out


@dataclass(frozen=True, slots=True)
class Shape:
    """The knobs every workload shares."""

    rate: float  # requests/s, fleet-wide
    requests: int
    seed: int = 0
    answer_tokens: int = 64


@dataclass(frozen=True, slots=True)
class Chat:
    system_prompts: int = 8
    system_tokens: int = 1024
    user_tokens: tuple[int, int] = (64, 256)
    mean_turns: float = 4.0
    max_turns: int = 8
    think_s: float = 3.0  # mean
    hot_share: float = 0.0  # fraction of conversations on system prompt 0 (skewed: 0.5)
    max_context: int = 7000


@dataclass(frozen=True, slots=True)
class DocQA:
    documents: int = 8
    document_tokens: int = 6000
    question_tokens: tuple[int, int] = (32, 128)


@dataclass(frozen=True, slots=True)
class Agentic:
    system_prompts: int = 4
    system_tokens: int = 1536
    task_tokens: int = 200
    steps: tuple[int, int] = (4, 12)
    tool_tokens: tuple[int, int] = (100, 400)
    tool_latency_s: float = 1.0  # mean
    max_context: int = 7500


def _starts(rng: random.Random, rate: float, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def chat(shape: Shape, spec: Chat = Chat(), name: str = "chat") -> list[Session]:
    rng = random.Random(shape.seed)
    n_conv = max(1, round(shape.requests / spec.mean_turns))
    systems = [tokens(f"{name}-{shape.seed}-sys-{k}", spec.system_tokens) for k in range(spec.system_prompts)]
    sessions = []
    for i, start in enumerate(_starts(rng, shape.rate / spec.mean_turns, n_conv)):
        if spec.hot_share and rng.random() < spec.hot_share:
            k = 0
        else:
            k = rng.randrange(1 if spec.hot_share else 0, spec.system_prompts)
        turns = min(spec.max_turns, 1 + int(rng.expovariate(1 / max(spec.mean_turns - 1, 1e-9))))
        key = f"{name}-{shape.seed}-c{i}"
        sessions.append(Session(key, start, _conversation(key, systems[k], f"sys-{k}", turns, spec, shape,
                                                          random.Random(f"{key}"))))
    return sessions


def _conversation(key: str, system: list[int], group: str, turns: int, spec: Chat, shape: Shape,
                  rng: random.Random) -> NextTurn:
    history = list(system)
    state = {"turn": 0}

    def next_turn(previous: Sequence[int] | None) -> Turn | None:
        if state["turn"] >= turns:
            return None
        if previous is not None:
            history.extend(previous)
        user = tokens(f"{key}-u{state['turn']}", rng.randint(*spec.user_tokens))
        if len(history) + len(user) + shape.answer_tokens > spec.max_context:
            return None
        history.extend(user)
        delay = 0.0 if state["turn"] == 0 else rng.expovariate(1 / spec.think_s)
        state["turn"] += 1
        return Turn(list(history), shape.answer_tokens, delay, group)
    return next_turn


def skewed(shape: Shape, spec: Chat = Chat(system_prompts=16, hot_share=0.5)) -> list[Session]:
    return chat(shape, spec, "skewed")


def docqa(shape: Shape, spec: DocQA = DocQA()) -> list[Session]:
    rng = random.Random(shape.seed)
    docs = [tokens(f"doc-{shape.seed}-{k}", spec.document_tokens) for k in range(spec.documents)]
    sessions = []
    for i, start in enumerate(_starts(rng, shape.rate, shape.requests)):
        k = rng.randrange(spec.documents)
        q = tokens(f"doc-{shape.seed}-q{i}", rng.randint(*spec.question_tokens))
        sessions.append(Session(f"docqa-{shape.seed}-u{i}", start,
                                turns_of([Turn(docs[k] + q, shape.answer_tokens, 0.0, f"doc-{k}")])))
    return sessions


def agentic(shape: Shape, spec: Agentic = Agentic()) -> list[Session]:
    rng = random.Random(shape.seed)
    mean_steps = sum(spec.steps) / 2
    n_agents = max(1, round(shape.requests / mean_steps))
    systems = [tokens(f"agent-{shape.seed}-sys-{k}", spec.system_tokens) for k in range(spec.system_prompts)]
    sessions = []
    for i, start in enumerate(_starts(rng, shape.rate / mean_steps, n_agents)):
        k = rng.randrange(spec.system_prompts)
        key = f"agent-{shape.seed}-a{i}"
        context = systems[k] + tokens(f"{key}-task", spec.task_tokens)
        sessions.append(Session(key, start, _agent(key, context, f"tools-{k}", rng.randint(*spec.steps), spec,
                                                   shape, random.Random(key))))
    return sessions


def _agent(key: str, context: list[int], group: str, steps: int, spec: Agentic, shape: Shape,
           rng: random.Random) -> NextTurn:
    state = {"step": 0}

    def next_turn(previous: Sequence[int] | None) -> Turn | None:
        if state["step"] >= steps:
            return None
        delay = 0.0
        if previous is not None:  # the model's tool call, then the tool's answer
            context.extend(previous)
            context.extend(tokens(f"{key}-tool{state['step']}", rng.randint(*spec.tool_tokens)))
            delay = rng.expovariate(1 / spec.tool_latency_s)
        if len(context) + shape.answer_tokens > spec.max_context:
            return None
        state["step"] += 1
        return Turn(list(context), shape.answer_tokens, delay, group)
    return next_turn


def nosharing(shape: Shape, lengths: tuple[int, int] = (512, 2048)) -> list[Session]:
    rng = random.Random(shape.seed)
    return [Session(f"unique-{shape.seed}-{i}", start,
                    turns_of([Turn(tokens(f"unique-{shape.seed}-{i}", rng.randint(*lengths)),
                                   shape.answer_tokens)]))
            for i, start in enumerate(_starts(rng, shape.rate, shape.requests))]


WORKLOADS = {"chat": chat, "docqa": docqa, "agentic": agentic, "skewed": skewed, "nosharing": nosharing}
