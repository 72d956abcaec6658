"""Every bad input gets an OpenAI-shaped error with the right status, through the SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.servers import LLM_NAME, Server

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "Hi"}]


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _shape(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("kwargs, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
])
def test_invalid_values_are_400(llm_server: Server, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(llm_server).chat.completions.create(model=LLM_NAME, messages=MSG, **kwargs)
    assert e.value.status_code == 400
    assert _shape(e.value.response.json())["param"] == param


def test_empty_messages_is_400(llm_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(llm_server).chat.completions.create(model=LLM_NAME, messages=[])
    assert e.value.status_code == 400 and _shape(e.value.response.json())["type"] == "invalid_request_error"


def test_malformed_json_is_400(llm_server: Server) -> None:
    r = httpx.post(llm_server.url + "/v1/chat/completions", content=b'{"model": "x", "messages": [',
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in _shape(r.json())["message"]


def test_unknown_model_is_404(llm_server: Server) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client(llm_server).chat.completions.create(model="gpt-nope", messages=MSG)
    assert e.value.status_code == 404 and e.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client(llm_server).completions.create(model="gpt-nope", prompt="x")
    with pytest.raises(openai.NotFoundError):
        client(llm_server).embeddings.create(model="gpt-nope", input="x")


def test_context_length_exceeded(llm_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(llm_server).chat.completions.create(model=LLM_NAME, messages=MSG, max_tokens=10_000)
    assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    long_prompt = "word " * 9000
    with pytest.raises(openai.BadRequestError) as e:
        client(llm_server).completions.create(model=LLM_NAME, prompt=long_prompt, max_tokens=1)
    assert e.value.code == "context_length_exceeded"


def test_bad_token_ids_are_400_and_server_survives(llm_server: Server) -> None:
    with pytest.raises(openai.BadRequestError):
        client(llm_server).completions.create(model=LLM_NAME, prompt=[1, 2, 10_000_000], max_tokens=2)
    r = client(llm_server).completions.create(model=LLM_NAME, prompt=[1, 2, 3], max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_oversized_body_is_413(tight_server: Server) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        client(tight_server).chat.completions.create(
            model=LLM_NAME, messages=[{"role": "user", "content": "x" * 10_000}])
    assert e.value.status_code == 413
    _shape(e.value.response.json())
    # Chunked upload without Content-Length is cut off as well.
    def chunks():
        yield b'{"model": "' + LLM_NAME.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 1000
        yield b'"}]}'
    r = httpx.post(tight_server.url + "/v1/chat/completions", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


async def test_queue_full_is_503_with_retry_after_and_pings(tight_server: Server) -> None:
    """One running slot and one queue place: the third concurrent request is refused,
    and the queued one receives `: ping` comments while it waits."""
    body = {"model": LLM_NAME, "messages": MSG, "max_tokens": 120, "temperature": 0, "stream": True,
            "ignore_eos": True}
    async with httpx.AsyncClient(base_url=tight_server.url, timeout=120) as http, \
            http.stream("POST", "/v1/chat/completions", json=body) as first:
        assert first.status_code == 200
        async with http.stream("POST", "/v1/chat/completions", json=body) as second:
            assert second.status_code == 200
            sdk = openai.AsyncOpenAI(base_url=tight_server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.InternalServerError) as refused:
                await sdk.chat.completions.create(model=LLM_NAME, messages=MSG, max_tokens=4)
            assert refused.value.status_code == 503
            assert int(refused.value.response.headers["retry-after"]) >= 1
            assert _shape(refused.value.response.json())["code"] == "queue_full"
            lines = []
            async for line in second.aiter_lines():
                lines.append(line)
                if line.startswith("data: ") and "content" in line:
                    break
            assert any(line.startswith(": ping") for line in lines)


def test_logprobs_unsupported_is_clear_400(llm_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(llm_server).chat.completions.create(model=LLM_NAME, messages=MSG, logprobs=True, max_tokens=2)
    assert "logprobs" in e.value.message


def test_body_that_is_not_json_is_400_with_a_clear_message(llm_server: Server) -> None:
    r = httpx.post(llm_server.url + "/v1/chat/completions", content=b"model=x",
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400
    assert "application/json" in _shape(r.json())["message"]
    r = httpx.post(llm_server.url + "/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400
