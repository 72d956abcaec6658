"""Anthropic's Messages API through the real gateway (uvicorn subprocess) with the real SmolLM2 on
the in-process transformers engine, driven by the official `anthropic` SDK."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.servers import LLM_NAME, Server

pytestmark = pytest.mark.integration

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # current SDKs take sampling fields only through extra_body


def client(server: Server, **kw: object) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120, **kw)


def test_create_answers_with_text_and_engine_counted_usage(llm_server: Server) -> None:
    c = client(llm_server)
    r = c.messages.create(model=LLM_NAME, max_tokens=24, messages=FRANCE, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert len(r.content) == 1 and r.content[0].type == "text" and "Paris" in r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.output_tokens > 0
    counted = c.messages.count_tokens(model=LLM_NAME, messages=FRANCE)
    assert counted.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)


def test_stream_events_follow_the_api_and_match_the_unstreamed_answer(llm_server: Server) -> None:
    c = client(llm_server)
    whole = c.messages.create(model=LLM_NAME, max_tokens=20, messages=FRANCE, extra_body=GREEDY)
    kinds = []
    with c.messages.stream(model=LLM_NAME, max_tokens=20, messages=FRANCE, extra_body=GREEDY) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(llm_server: Server) -> None:
    c = client(llm_server)
    free = c.messages.create(model=LLM_NAME, max_tokens=24, messages=FRANCE, extra_body=GREEDY).content[0].text
    words = free.split()
    assert len(words) >= 3, free
    stop = " " + words[2]  # a word from the middle of the greedy answer
    head = free[: free.index(stop)]
    r = c.messages.create(model=LLM_NAME, max_tokens=24, messages=FRANCE, extra_body=GREEDY, stop_sequences=[stop])
    assert (r.stop_reason, r.stop_sequence, r.content[0].text) == ("stop_sequence", stop, head)
    with c.messages.stream(model=LLM_NAME, max_tokens=24, messages=FRANCE, extra_body=GREEDY,
                           stop_sequences=[stop]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == head and final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_bad_requests_get_anthropic_errors(llm_server: Server) -> None:
    c = client(llm_server)
    with pytest.raises(anthropic.NotFoundError) as nf:
        c.messages.create(model="no-such-model", max_tokens=4, messages=FRANCE)
    assert nf.value.body["type"] == "error" and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        c.messages.create(model=LLM_NAME, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error" and "image" in bad.value.body["error"]["message"]
    r = httpx.post(llm_server.url + "/v1/messages", json={"model": LLM_NAME, "messages": FRANCE}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(llm_server.url + "/v1/messages", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    deep = {"type": "text", "text": "x"}
    for _ in range(200):
        deep = {"type": "tool_result", "tool_use_id": "t", "content": [deep]}
    r = httpx.post(llm_server.url + "/v1/messages", timeout=30, json={
        "model": LLM_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": [deep]}]})
    assert r.status_code in (400, 413) and r.json()["type"] == "error"
    r = httpx.get(llm_server.url + "/v1/messages", timeout=30)
    assert r.status_code == 405 and r.json()["type"] == "error"
    # The server is unharmed.
    assert c.messages.create(model=LLM_NAME, max_tokens=2, messages=FRANCE).usage.output_tokens > 0


async def test_a_full_server_answers_529_overloaded(tight_server: Server) -> None:
    """One running slot and one queue place: the third concurrent request is refused as Anthropic
    refuses when it is full."""
    body = {"model": LLM_NAME, "messages": FRANCE, "max_tokens": 120, "temperature": 0, "stream": True}
    async with httpx.AsyncClient(base_url=tight_server.url, timeout=120) as http, \
            http.stream("POST", "/v1/messages", json=body) as first:
        assert first.status_code == 200
        async with http.stream("POST", "/v1/messages", json=body) as second:
            assert second.status_code == 200
            sdk = anthropic.AsyncAnthropic(base_url=tight_server.url, api_key="unused", max_retries=0)
            with pytest.raises(anthropic.APIStatusError) as refused:
                await sdk.messages.create(model=LLM_NAME, max_tokens=4, messages=FRANCE)
            assert refused.value.status_code == 529
            assert refused.value.body["error"]["type"] == "overloaded_error"
            assert int(refused.value.response.headers["retry-after"]) >= 1
