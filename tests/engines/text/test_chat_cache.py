"""Incremental chat tokenization on the real SmolLM2 tokenizer: every render equals a full
render, turn after turn, and a new turn reuses the cached conversation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engines.text.tokenizer import ChatTokenizer
from engines.weights import resolve_llm

ROOT = Path(__file__).resolve().parents[3]
WORDS = [
    "the", "river", "runs", "to", "the", "sea", "while", "ships", "sail", "by", "with", "cargo", "of",
    "silk", "😀", "天気", "<tag>", "\n\n", "", "",
]


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(resolve_llm("smollm2-135m-instruct", ROOT / "model_repository"))


def _full(tok: ChatTokenizer, messages: list[dict], **kw: object) -> list[int]:
    text = tok._tok.apply_chat_template(messages, tokenize=False, **kw)
    return list(tok._tok.encode(text, add_special_tokens=False))


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_turn_after_turn_equals_a_full_render(tok: ChatTokenizer) -> None:
    rng = random.Random(7)
    messages = [{"role": "system", "content": "You are terse."}]
    hits = tok._chats.hits
    for _ in range(25):
        messages.append({"role": "user", "content": _text(rng, rng.randint(1, 400))})
        assert tok.render_chat(messages) == _full(tok, messages, add_generation_prompt=True)
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(1, 200))})
    assert tok._chats.hits - hits == 24  # every turn after the first reused the conversation so far


def test_edits_tools_and_flags_never_reuse_a_wrong_prefix(tok: ChatTokenizer) -> None:
    rng = random.Random(11)
    base = [{"role": "user", "content": _text(rng, 50)}, {"role": "assistant", "content": _text(rng, 50)},
            {"role": "user", "content": _text(rng, 50)}]
    assert tok.render_chat(base) == _full(tok, base, add_generation_prompt=True)
    edited = [dict(base[0], content=base[0]["content"] + " changed"), *base[1:]]
    assert tok.render_chat(edited) == _full(tok, edited, add_generation_prompt=True)
    longer = [*base, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    assert tok.render_chat(longer, add_generation_prompt=False) == _full(tok, longer, add_generation_prompt=False)
    cont = [*base, {"role": "assistant", "content": "The answer is"}]
    assert tok.render_chat(cont, continue_final_message=True) == _full(
        tok, cont, add_generation_prompt=False, continue_final_message=True)


def test_cache_is_bounded_by_tokens(tok: ChatTokenizer) -> None:
    cache = tok._chats
    rng = random.Random(3)
    for i in range(50):
        tok.render_chat([{"role": "user", "content": f"{i} " + _text(rng, 300)}])
    assert cache._tokens <= cache._max_tokens
    small = ChatTokenizer(resolve_llm("smollm2-135m-instruct", ROOT / "model_repository"))
    small._chats._max_tokens = 2000
    for i in range(20):
        small.render_chat([{"role": "user", "content": f"{i} " + _text(rng, 300)}])
    assert small._chats._tokens <= 2000 and len(small._chats._entries) < 20
