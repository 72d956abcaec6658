"""The sim's request parsing: vLLM's limits and errors, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from engines.sim.serving.openai_requests import ApiError, RequestParser


class WordTokenizer:
    """One token per word: enough to count tokens; the chat 'template' joins role: content lines."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [len(w) for w in text.split()]

    def render_chat(self, messages: list[dict[str, Any]], **_: Any) -> list[int]:
        return self.encode(" ".join(f"{m['role']}: {m['content']}" for m in messages))


def parser(max_model_len: int = 100) -> RequestParser:
    return RequestParser("m", WordTokenizer(), max_model_len, vocab_size=1000)  # type: ignore[arg-type]


def refused(call: Any, status: int = 400) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == status and e.value.body()["error"]["code"] == status
    return e.value


def test_prompt_forms() -> None:
    p = parser()
    assert p.completion({"prompt": [5, 6, 7]}, "r").prompt_token_ids == [5, 6, 7]
    assert p.completion({"prompt": [[5, 6]]}, "r").prompt_token_ids == [5, 6]
    assert p.completion({"prompt": "a bb ccc"}, "r").prompt_token_ids == [1, 2, 3]
    assert p.completion({"prompt": ["a bb"]}, "r").prompt_token_ids == [1, 2]
    assert "one prompt" in refused(lambda: p.completion({"prompt": [[1], [2]]}, "r")).message
    assert "out of vocabulary" in refused(lambda: p.completion({"prompt": [1, 5000]}, "r")).message


def test_too_long_is_vllms_400() -> None:
    e = refused(lambda: parser(10).completion({"prompt": list(range(12))}, "r"))
    assert e.message.startswith("This model's maximum context length is 10 tokens. However, your prompt contains 12")
    assert (e.err_type, e.param) == ("BadRequestError", "input_tokens")


def test_an_unknown_model_is_a_404() -> None:
    e = refused(lambda: parser().completion({"model": "x", "prompt": [1]}, "r"), 404)
    assert (e.err_type, e.message) == ("NotFoundError", "The model `x` does not exist. Valid aliases: m.")


def test_max_tokens_defaults_and_clamps() -> None:
    p = parser(100)
    assert p.completion({"prompt": [1] * 10}, "r").max_tokens == 16
    assert p.completion({"prompt": [1] * 10, "max_tokens": 500}, "r").max_tokens == 90
    assert p.chat({"messages": [{"role": "user", "content": "hi there"}]}, "r").max_tokens == 97
    assert p.chat({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4}, "r").max_tokens == 4
    assert "at least 1" in refused(lambda: p.completion({"prompt": [1], "max_tokens": 0}, "r")).message


def test_what_the_sim_does_not_do_is_refused_plainly() -> None:
    p = parser()
    assert "n=1" in refused(lambda: p.completion({"prompt": [1], "n": 2}, "r")).message
    assert "logprobs" in refused(lambda: p.completion({"prompt": [1], "logprobs": 2}, "r")).message
    assert "stream=True" in refused(lambda: p.completion({"prompt": [1], "stream_options": {}}, "r")).message
    assert p.completion({"prompt": [1], "n": None, "top_k": 5, "stop": ["x"]}, "r").max_tokens == 16


def test_seeds_by_seed_then_prompt_for_greedy_then_request_id() -> None:
    p = parser()
    seeded = [p.completion({"prompt": [1, 2], "seed": 9}, rid).seed for rid in ("a", "b")]
    greedy = [p.completion({"prompt": [1, 2], "temperature": 0}, rid).seed for rid in ("a", "b")]
    sampled = [p.completion({"prompt": [1, 2]}, rid).seed for rid in ("a", "b")]
    assert seeded == [9, 9] and greedy[0] == greedy[1] and sampled[0] != sampled[1]


def test_chat_content_parts_are_joined_and_other_parts_refused() -> None:
    p = parser()
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "bb"}]
    assert p.chat({"messages": [{"role": "developer", "content": parts}]}, "r").prompt_token_ids == [7, 1, 2]
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    assert "text content" in refused(lambda: p.chat({"messages": [{"role": "user", "content": image}]}, "r")).message
