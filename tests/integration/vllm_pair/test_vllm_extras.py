"""Only the vLLM extras the gateway knows reach a real vLLM worker (issue 20, item 11).

Any other field is refused as OpenAI refuses it (400, "Unrecognized request argument
supplied: X"): vLLM would act on some of them (documents, truncation, prompt embeddings,
template switches) after the gateway checked quota and context on another prompt. The
official SDK's `extra_body` keeps working for the extras the gateway knows.
"""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import MODEL
from tests.servers import Server

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

HELLO = [{"role": "user", "content": "Say hello."}]
# vLLM extras that change the prompt it runs, or what it runs it with.
UNKNOWN_CHAT = {
    "documents": [{"title": "t", "text": "injected"}],
    "truncate_prompt_tokens": 4,
    "add_special_tokens": True,
    "mm_processor_kwargs": {"x": 1},
    "priority": -100,
    "kv_transfer_params": {"do_remote_prefill": True},
    "vllm_xargs": {"a": 1},
    "echo": True,
    "request_id": "mine",
}


def _sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def _refused(call: object, param: str, message: str | None = None) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        call()  # type: ignore[operator]
    body = e.value.body
    assert e.value.status_code == 400 and isinstance(body, dict), body
    assert body["param"] == param and body["type"] == "invalid_request_error", body
    assert body["message"] == (message or f"Unrecognized request argument supplied: {param}"), body


@pytest.mark.parametrize("field", list(UNKNOWN_CHAT))
def test_unknown_chat_fields_are_refused_by_name(gateway: Server, field: str) -> None:
    _refused(lambda: _sdk(gateway).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2, extra_body={field: UNKNOWN_CHAT[field]}), field)


def test_unknown_completion_and_message_fields_are_refused(gateway: Server) -> None:
    c = _sdk(gateway)
    _refused(lambda: c.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                          extra_body={"prompt_embeds": "AAAA"}), "prompt_embeds")
    _refused(lambda: c.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                          extra_body={"truncate_prompt_tokens": 1}), "truncate_prompt_tokens")
    _refused(lambda: c.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi", "template_only": "x"}]),  # type: ignore[misc,list-item]
        "messages.0.template_only")
    # An OpenAI field whose vLLM meaning is a chat-template variable: refused, not silently run.
    _refused(lambda: c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, reasoning_effort="low"),
             "reasoning_effort", "'reasoning_effort' is not supported by this server")


def test_known_extras_still_reach_vllm_through_extra_body(gateway: Server) -> None:
    c = _sdk(gateway)
    r = c.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=5, temperature=0, store=False, metadata={"team": "x"},
        extra_body={"ignore_eos": True, "min_tokens": 5, "top_k": 1, "repetition_penalty": 1.0,
                    "include_stop_str_in_output": False, "cache_salt": "my-own-split",
                    "add_generation_prompt": True, "chat_template_kwargs": {}})
    assert r.usage is not None and r.usage.completion_tokens == 5
    # vLLM's structured outputs constrain decoding, not the prompt: known, forwarded.
    r = c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content in ("yes", "no")
    # An assistant message as a response carried it (refusal, vLLM's reasoning) goes back as history.
    history = [*HELLO, {"role": "assistant", "content": "Hello.", "refusal": None, "reasoning_content": "hmm"},
               {"role": "user", "content": "Again."}]
    r = c.chat.completions.create(model=MODEL, messages=history, max_tokens=2, extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.completion_tokens == 2
    r2 = c.completions.create(model=MODEL, prompt="Hello", max_tokens=3, extra_body={"ignore_eos": True, "top_k": 1})
    assert r2.usage is not None and r2.usage.completion_tokens == 3
