"""OpenAI's Responses API through the real gateway (uvicorn subprocess) with the real SmolLM2 on the
in-process transformers engine, driven by the official `openai` SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.servers import LLM_NAME, Server

pytestmark = pytest.mark.integration

FRANCE = "What is the capital of France?"


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_create_retrieve_delete(llm_server: Server) -> None:
    c = client(llm_server)
    r = c.responses.create(model=LLM_NAME, input=FRANCE, temperature=0, max_output_tokens=24,
                           instructions="Answer in one sentence.", metadata={"ticket": "42"})
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert "Paris" in r.output_text and r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Answer in one sentence." and r.metadata == {"ticket": "42"}
    got = c.responses.retrieve(r.id)
    assert got.output_text == r.output_text and got.usage.output_tokens == r.usage.output_tokens
    items = c.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == FRANCE
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)


def test_stream_events_follow_the_api_and_match_the_unstreamed_answer(llm_server: Server) -> None:
    c = client(llm_server)
    whole = c.responses.create(model=LLM_NAME, input=FRANCE, temperature=0, max_output_tokens=16, store=False)
    kinds, deltas = [], []
    with c.responses.stream(model=LLM_NAME, input=FRANCE, temperature=0, max_output_tokens=16) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if whole.status == "completed" else "response.incomplete")
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        assert kind in kinds
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    with pytest.raises(openai.NotFoundError):  # store=False keeps nothing
        c.responses.retrieve(whole.id)
    assert c.responses.retrieve(final.id).output_text == final.output_text  # a stream is stored too


def test_previous_response_id_continues_the_conversation(llm_server: Server) -> None:
    c = client(llm_server)
    first = c.responses.create(model=LLM_NAME, input="My name is Ada. Remember it.", temperature=0,
                               max_output_tokens=12)
    second = c.responses.create(model=LLM_NAME, input="What is my name?", temperature=0, max_output_tokens=12,
                                previous_response_id=first.id)
    # The whole first turn (question and answer) was rendered ahead of the second question.
    alone = c.responses.create(model=LLM_NAME, input="What is my name?", temperature=0, max_output_tokens=12,
                               store=False)
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens + 5
    assert second.previous_response_id == first.id
    assert [i.content[0].text for i in c.responses.input_items.list(second.id).data] == ["What is my name?"]


def test_bad_requests_are_refused_in_openais_shape(llm_server: Server) -> None:
    c = client(llm_server)
    with pytest.raises(openai.NotFoundError) as nf:
        c.responses.create(model=LLM_NAME, input="hi", previous_response_id="resp_doesnotexist")
    assert nf.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as bad:
        c.responses.create(model=LLM_NAME, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/x.png"}]}])
    assert "input_image" in bad.value.message
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model=LLM_NAME, input="hi", tools=[{"type": "web_search"}])
    r = httpx.post(llm_server.url + "/v1/responses", timeout=30, json={
        "model": LLM_NAME, "input": [{"role": "user", "content": "x"}] * 5000})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    r = httpx.post(llm_server.url + "/v1/responses", timeout=30, json={"model": LLM_NAME, "input": "x",
                                                                       "metadata": {"a": deep}})
    assert r.status_code in (400, 413), r.text
    assert c.responses.create(model=LLM_NAME, input="hi", max_output_tokens=2, store=False).usage.output_tokens > 0
