"""What a remote worker's chat endpoint is sent of the client's body: what the gateway rendered from."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engines.errors import SluiceError
from gateway.openai.chat import forwarded
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest, refuse_unsupported


def test_messages_keep_only_their_rendered_fields() -> None:
    body = ChatCompletionRequest.model_validate({
        "model": "m", "max_tokens": 3, "cache_salt": "mine", "user": "u", "store": True,
        "tools": [{"type": "function", "function": {"name": "f"}}], "continue_final_message": True,
        "messages": [{"role": "user", "content": "hi", "name": "ann"},
                     {"role": "assistant", "content": "x", "refusal": None, "reasoning_content": "secret plan"}]})
    out = forwarded(body, "served")
    assert out["messages"] == [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "x"}]
    assert out["model"] == "served" and out["continue_final_message"] is True and out["tools"]
    assert not {"cache_salt", "user", "store", "max_tokens"} & set(out)


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
@pytest.mark.parametrize("field", ["documents", "truncate_prompt_tokens", "prompt_embeds", "priority"])
def test_unknown_fields_are_refused(model: type, field: str) -> None:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    base.pop("prompt" if model is ChatCompletionRequest else "messages")
    with pytest.raises(ValidationError) as e:
        model.model_validate({**base, field: 1})
    assert [err["type"] for err in e.value.errors()] == ["extra_forbidden"]


@pytest.mark.parametrize("salt", ["", "a/b", "x" * 129, "a@b"])
def test_client_cache_salt_follows_vllms_rule(salt: str) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", "cache_salt": salt})


def test_unsupported_openai_fields_are_refused_by_name() -> None:
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "reasoning_effort": "low"})
    with pytest.raises(SluiceError) as e:
        refuse_unsupported(body)
    assert e.value.param == "reasoning_effort"
    refuse_unsupported(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text"]}))
