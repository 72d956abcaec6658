"""IncrementalDetokenizer on the real SmolLM2 tokenizer (byte-level BPE: characters split across tokens)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engines.text.detokenizer import IncrementalDetokenizer
from engines.weights import resolve_llm

ROOT = Path(__file__).resolve().parents[3]

LONG_TEXT = """\
The capital of France is Paris. Its population is about 2.1 million; the metropolitan area holds 12 million.
Café, naïve, façade, Œuvre — «quotes» and “curly quotes”.
日本語のテキスト: 東京は日本の首都です。中文：北京是中国的首都。한국어: 서울은 한국의 수도입니다.
Emoji: 👋🌍🚀 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and a skin tone 👍🏽.
def f(x: int) -> int:\n    return x ** 2  # code with    spaces\t and tabs
Math: ∑ᵢ xᵢ² ≤ ∞, ∀ε>0 ∃δ. Арифметика и греческий: αβγ.
"""


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_llm("smollm2-135m-instruct", ROOT / "model_repository"))


def stream(tokenizer: Any, ids: Sequence[int], chunks: Sequence[int] | None = None,
           **kw: Any) -> tuple[list[str], bool]:
    """Feed ids in chunks of the given sizes (one at a time by default), as the engine does."""

    def decode(part: Sequence[int]) -> str:
        return str(tokenizer.decode(list(part), skip_special_tokens=True))

    d = IncrementalDetokenizer(decode, **kw)
    sizes = list(chunks) if chunks is not None else [1] * len(ids)
    out: list[str] = []
    pos = 0
    for size in sizes:
        step = d.step(ids[pos : pos + size], last=pos + size >= len(ids))
        pos += size
        out.append(step.text)
        if step.stopped:
            return out, True
    return out, False


def test_an_emoji_split_across_tokens_is_held_back_until_complete(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hi 👋 there", add_special_tokens=False)
    assert len(ids) > 4  # the emoji's four bytes span several tokens
    out, _ = stream(tokenizer, ids)
    assert "".join(out) == "Hi 👋 there"
    assert not any("\ufffd" in piece for piece in out)
    assert "" in out  # some token carried only part of the emoji


def test_cjk_split_across_tokens_equals_a_full_decode(tokenizer: Any) -> None:
    text = "世界 東京 北京是中国的首都"
    ids = tokenizer.encode(text, add_special_tokens=False)
    out, _ = stream(tokenizer, ids)
    assert "".join(out) == text and not any("\ufffd" in piece for piece in out)


def test_a_stop_string_spanning_token_boundaries_is_cut_and_not_leaked(tokenizer: Any) -> None:
    ids = tokenizer.encode("The capital of France is Paris. It is big.", add_special_tokens=False)
    # Starts inside " France" and ends inside " Paris".
    out, stopped = stream(tokenizer, ids, stop=("ance is Pa",))
    assert stopped and "".join(out) == "The capital of Fr"
    kept, stopped = stream(tokenizer, ids, stop=("ance is Pa",), include_stop_str=True)
    assert stopped and "".join(kept) == "The capital of France is Pa"


def test_a_stop_string_that_is_an_emoji_split_across_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hi 👋 there", add_special_tokens=False)
    out, stopped = stream(tokenizer, ids, stop=("👋",))
    assert stopped and "".join(out) == "Hi "


def test_long_real_text_streams_exactly_as_a_full_decode(tokenizer: Any) -> None:
    ids = tokenizer.encode(LONG_TEXT * 4, add_special_tokens=False)
    # Special tokens in the stream are skipped, as the engine's decode does.
    ids[100:100] = [tokenizer.eos_token_id]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    out, _ = stream(tokenizer, ids)
    assert "".join(out) == full
    rng = random.Random(3)
    chunks = [rng.randint(1, 5) for _ in range(len(ids))]
    out, _ = stream(tokenizer, ids, chunks)
    assert "".join(out) == full


def test_random_ids_with_invalid_utf8_stream_exactly_as_a_full_decode(tokenizer: Any) -> None:
    # Random ids include lone byte pieces that never form a character: the replacement
    # characters a full decode shows must come out too, and in the same places.
    rng = random.Random(11)
    ids = [rng.randrange(len(tokenizer)) for _ in range(3000)]
    full = tokenizer.decode(ids, skip_special_tokens=True)
    assert "\ufffd" in full
    out, _ = stream(tokenizer, ids)
    assert "".join(out) == full
