"""The OpenAI response encoding, in-process: chat and completions, streamed and collected,
from a Dispatch over scripted engines. No server: the integration tests were the only check
of these bytes, and a renamed `object` slipped past the unit loop."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from engines.base import Delta
from gateway.llm.dispatch import Dispatch
from gateway.llm.service import Prompt
from gateway.openai import chat, completions
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.openai.streaming import json_body, sse
from tests.gateway.llm.fakes import FakeEngine, Hooks, Step, dispatch, retryable, tokens

PROMPT_IDS = [1, 2, 3]  # what fakes.request() sends: 3 prompt tokens, counted once for all choices
SCRIPTS: list[list[Step]] = [tokens("Hel", "lo"), tokens("Bye")]  # choice i plays SCRIPTS[i]
USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}  # 2 + 1 completion tokens


def _text(script: Sequence[Step]) -> str:
    return "".join(s.text for s in script if isinstance(s, Delta))


def _dispatch(scripts: Sequence[Sequence[Step]]) -> Dispatch:
    d, _ = dispatch(Hooks(), *[[FakeEngine(f"w{i}", s)] for i, s in enumerate(scripts)])
    return d


def _chat_body(n: int, include_usage: bool) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n, "stream": True,
         "stream_options": {"include_usage": include_usage}})


def _completion_body(n: int, include_usage: bool) -> CompletionRequest:
    return CompletionRequest.model_validate(
        {"model": "m", "prompt": PROMPT_IDS, "n": n, "stream": True,
         "stream_options": {"include_usage": include_usage}})


async def _decode(chunks: AsyncIterator[bytes]) -> list[dict[str, Any]]:
    return [json.loads(c) async for c in chunks]


def _check_envelope(chunks: list[dict[str, Any]], obj: str) -> None:
    """One id, one created and one model across the stream, and the right object."""
    assert [c["object"] for c in chunks] == [obj] * len(chunks)
    assert {c["id"] for c in chunks} == {"r"}  # fakes.dispatch() names the request "r"
    assert len({c["created"] for c in chunks}) == 1
    assert {c["model"] for c in chunks} == {"m"}


def _split_usage(chunks: list[dict[str, Any]], include_usage: bool) -> list[dict[str, Any]]:
    """The choice chunks; with include_usage the last chunk carries the usage and no choice."""
    if not include_usage:
        assert all("usage" not in c for c in chunks)
        return chunks
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"] == USAGE
    assert all(c["usage"] is None for c in chunks[:-1])
    return chunks[:-1]


def _by_choice(chunks: list[dict[str, Any]], n: int) -> dict[int, list[dict[str, Any]]]:
    assert all(len(c["choices"]) == 1 for c in chunks)
    per: dict[int, list[dict[str, Any]]] = {}
    for c in chunks:
        per.setdefault(c["choices"][0]["index"], []).append(c["choices"][0])
    assert sorted(per) == list(range(n))
    for choices in per.values():  # only each choice's last chunk finishes it
        assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["stop"]
    return per


@pytest.mark.parametrize(("n", "include_usage"), [(1, False), (2, True)])
async def test_chat_stream(n: int, include_usage: bool) -> None:
    d = _dispatch(SCRIPTS[:n])
    chunks = await _decode(chat.stream_chunks(d, _chat_body(n, include_usage)))
    _check_envelope(chunks, "chat.completion.chunk")
    per = _by_choice(_split_usage(chunks, include_usage), n)
    for i, choices in per.items():
        deltas = [c["delta"] for c in choices]
        assert deltas[0] == {"role": "assistant", "content": ""}  # the role, once, first
        assert all("role" not in x for x in deltas[1:])
        assert "".join(x.get("content", "") for x in deltas) == _text(SCRIPTS[i])


@pytest.mark.parametrize(("n", "include_usage"), [(1, False), (2, True)])
async def test_completion_stream(n: int, include_usage: bool) -> None:
    d = _dispatch(SCRIPTS[:n])
    body = _completion_body(n, include_usage)
    chunks = await _decode(completions.stream_chunks(d, body, [Prompt(PROMPT_IDS)]))
    _check_envelope(chunks, "text_completion")
    per = _by_choice(_split_usage(chunks, include_usage), n)
    for i, choices in per.items():
        assert "".join(c["text"] for c in choices) == _text(SCRIPTS[i])


async def test_chat_collect() -> None:
    result = await chat.collect(_dispatch(SCRIPTS))
    _check_envelope([result], "chat.completion")
    assert result["choices"] == [
        {"index": i, "message": {"role": "assistant", "content": _text(s)}, "logprobs": None,
         "finish_reason": "stop"} for i, s in enumerate(SCRIPTS)]
    assert result["usage"] == USAGE


async def test_completion_collect() -> None:
    body = _completion_body(2, include_usage=False)
    result = await completions.collect(_dispatch(SCRIPTS), body, [Prompt(PROMPT_IDS)])
    _check_envelope([result], "text_completion")
    assert result["choices"] == [
        {"index": i, "text": _text(s), "logprobs": None, "finish_reason": "stop"} for i, s in enumerate(SCRIPTS)]
    assert result["usage"] == USAGE


async def _sse_events(events: AsyncIterator[bytes]) -> list[Any]:
    """The `data:` payloads the SSE relay frames, read straight from its event source."""
    response = sse(events, ping_s=60, headers={})
    frames = [frame async for frame in response.events]
    assert all(f.startswith(b"data: ") and f.endswith(b"\n\n") for f in frames)
    return [f[6:-2].decode() if f == b"data: [DONE]\n\n" else json.loads(f[6:-2]) for f in frames]


FAILURES: list[tuple[Step, dict[str, Any]]] = [
    # The engine reports the failure in its last delta...
    (Delta(finish_reason="error", error="oom"),
     {"message": "oom", "type": "server_error", "param": None, "code": None}),
    # ...or its stream raises after the first delta (too late to fail over).
    (retryable("the stream broke"),
     {"message": "the stream broke", "type": "server_error", "param": None, "code": "unavailable"}),
]


@pytest.mark.parametrize(("failure", "error"), FAILURES)
async def test_chat_error_after_first_delta_is_one_error_event(failure: Step, error: dict[str, Any]) -> None:
    d = _dispatch([[Delta(text="hel", token_ids=[7]), failure]])
    events = await _sse_events(chat.stream_chunks(d, _chat_body(1, include_usage=True)))
    assert [e["choices"][0]["delta"] for e in events[:2]] == [{"role": "assistant", "content": ""},
                                                             {"content": "hel"}]
    _check_envelope(events[:2], "chat.completion.chunk")
    assert events[2:] == [{"error": error}, "[DONE]"]  # no usage chunk after a failure
    assert d.closed


@pytest.mark.parametrize(("failure", "error"), FAILURES)
async def test_completion_error_after_first_delta_is_one_error_event(failure: Step, error: dict[str, Any]) -> None:
    d = _dispatch([[Delta(text="hel", token_ids=[7]), failure]])
    body = _completion_body(1, include_usage=False)
    events = await _sse_events(completions.stream_chunks(d, body, [Prompt(PROMPT_IDS)]))
    _check_envelope(events[:1], "text_completion")
    assert events[0]["choices"] == [{"index": 0, "text": "hel", "logprobs": None, "finish_reason": None}]
    assert events[1:] == [{"error": error}, "[DONE]"]
    assert d.closed


# The same answer as a remote engine gives it: decoded (`text`), or spliced from its worker's
# events (`text_json`, engines.remote.splice). Quotes, escapes, non-ASCII and an empty token.
_PIECES = [("Hé \"q\"", [1, 2]), ("", [3]), ("\n\\", [4]), ("😀 end", [5])]


def _answer(spliced: bool) -> list[Step]:
    out: list[Step] = []
    count = 0
    for text, ids in _PIECES:
        count += len(ids)
        out.append(Delta(text_json=json_body(text), completion_tokens=count) if spliced
                   else Delta(text=text, token_ids=ids, completion_tokens=count))
    out.append(Delta(finish_reason="length", completion_tokens=count, prompt_tokens=3, cached_tokens=1))
    return out


async def _both(stream: Any, n: int) -> tuple[list[bytes], list[bytes], Hooks, Hooks]:
    """The chunk bytes and router calls of the decoded and the spliced answer; each chunk the client
    gets is marked among the calls, so a first token heard late would show (with n=1: n>1 choices are
    read ahead of the client by one task each)."""
    runs = []
    for spliced in (False, True):
        hooks = Hooks()
        d, _ = dispatch(hooks, *[[FakeEngine(f"w{i}", _answer(spliced))] for i in range(n)])
        chunks = []
        async for c in stream(d):
            chunks.append(c)
            hooks.calls.append(("chunk",))
        runs.append((chunks, hooks))
    (full, full_hooks), (fast, fast_hooks) = runs
    return full, fast, full_hooks, fast_hooks


@pytest.mark.parametrize("n", [1, 2])
async def test_a_spliced_chat_stream_is_byte_for_byte_the_decoded_one(n: int) -> None:
    full, fast, full_hooks, fast_hooks = await _both(lambda d: chat.stream_chunks(d, _chat_body(n, True)), n)
    assert fast == full
    assert "".join(json.loads(c)["choices"][0]["delta"].get("content", "") for c in full if json.loads(c)["choices"]
                   ) == n * "".join(t for t, _ in _PIECES)
    assert fast_hooks.calls == full_hooks.calls  # first token before the first chunk, finish at 5 tokens
    assert [c[4] for c in fast_hooks.finishes()] == [5] * n


@pytest.mark.parametrize("n", [1, 2])
async def test_a_spliced_completion_stream_is_byte_for_byte_the_decoded_one(n: int) -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": "héllo", "n": n, "echo": True, "stream": True,
                                             "stream_options": {"include_usage": True}})
    prompts = [Prompt(PROMPT_IDS, text="héllo")]
    full, fast, full_hooks, fast_hooks = await _both(lambda d: completions.stream_chunks(d, body, prompts), n)
    assert fast == full
    assert json.loads(full[-1])["usage"] == {"prompt_tokens": 3, "completion_tokens": 5 * n, "total_tokens": 3 + 5 * n,
                                             "prompt_tokens_details": {"cached_tokens": 1}}
    assert fast_hooks.calls == full_hooks.calls
