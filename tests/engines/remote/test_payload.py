"""RemoteEngine's pure parts: request bodies, error normalisation, SSE assembly."""

from __future__ import annotations

import json

import pytest

from engines.base import EngineRequest, SamplingParams
from engines.errors import ErrorKind
from engines.remote.errors import normalize_error
from engines.remote.payload import build_body
from engines.remote.stream import StreamAssembler


def _request(kind: str = "completion", **sampling: object) -> EngineRequest:
    chat_body = {"model": "client-name", "messages": [{"role": "user", "content": "hi"}], "n": 1,
                 "max_completion_tokens": 999, "tools": [{"type": "function", "function": {"name": "f"}}]}
    return EngineRequest(request_id="r", model="m", prompt_token_ids=[5, 6, 7],
                         sampling=SamplingParams(max_tokens=8, **sampling),  # type: ignore[arg-type]
                         kind=kind, chat_body=chat_body if kind == "chat" else None)  # type: ignore[arg-type]


def test_completion_sends_token_ids_and_engine_extras() -> None:
    path, body = build_body(_request(top_k=5, min_p=0.1, repetition_penalty=1.2, stop_token_ids=(2,),
                                     ignore_eos=True, min_tokens=3, seed=7, logprobs=2, stop=("x",),
                                     include_stop_str_in_output=True, presence_penalty=0.5), "vllm", "served")
    assert path == "/v1/completions"
    assert body["prompt"] == [5, 6, 7] and body["model"] == "served"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (5, 0.1, 1.2)
    assert (body["stop_token_ids"], body["ignore_eos"], body["min_tokens"], body["seed"]) == ([2], True, 3, 7)
    assert body["logprobs"] == 2 and body["stop"] == ["x"] and body["include_stop_str_in_output"] is True
    assert body["presence_penalty"] == 0.5 and body["return_token_ids"] is True


def test_priority_goes_only_to_a_vllm_worker_that_schedules_by_it() -> None:
    urgent = _request("chat")
    urgent.priority = -1
    assert build_body(urgent, "vllm", priority=True)[1]["priority"] == -1
    assert "priority" not in build_body(urgent, "vllm")[1]  # vLLM would refuse it: not started so
    assert "priority" not in build_body(urgent, "trtllm", priority=True)[1]
    assert "priority" not in build_body(_request("chat"), "vllm", priority=True)[1]  # the default class: 0, unsent


def test_chat_keeps_client_fields_but_gateway_sampling_wins() -> None:
    path, body = build_body(_request("chat", temperature=0.0, logprobs=3), "vllm")
    assert path == "/v1/chat/completions"
    assert body["tools"][0]["function"]["name"] == "f"  # the engine's tool parser needs them
    assert body["max_tokens"] == 8 and "max_completion_tokens" not in body and "n" not in body
    assert body["model"] == "m" and body["temperature"] == 0.0
    assert body["logprobs"] is True and body["top_logprobs"] == 3


def test_trtllm_and_openai_dialects_send_no_vllm_only_fields() -> None:
    _, trt = build_body(_request(top_k=5), "trtllm")
    assert trt["top_k"] == 5 and "return_token_ids" not in trt
    _, plain = build_body(_request(top_k=5), "openai")
    assert "top_k" not in plain and "return_token_ids" not in plain


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, {"error": {"message": "bad temp", "type": "BadRequestError", "param": "temperature", "code": 400}},
         (ErrorKind.INVALID_ARG, None, "temperature", False)),
        (404, {"object": "error", "message": "The model `x` does not exist.", "type": "NotFoundError",
               "param": None, "code": 404}, (ErrorKind.NOT_FOUND, "model_not_found", None, False)),
        (400, {"object": "error", "message": "This model's maximum context length is 2048 tokens",
               "type": "BadRequestError", "param": None, "code": 400},
         (ErrorKind.CONTEXT_TOO_LONG, "context_length_exceeded", None, False)),
        (503, "<html>upstream down</html>", (ErrorKind.UNAVAILABLE, None, None, True)),
        (500, "", (ErrorKind.INTERNAL, None, None, True)),
    ],
)
def test_error_shapes_normalise(status: int, body: object, expected: tuple[object, ...]) -> None:
    raw = body if isinstance(body, str) else json.dumps(body)
    err = normalize_error(status, raw.encode())
    assert (err.kind, err.code, err.param, err.retryable) == expected
    assert err.message


def test_assembler_holds_finish_until_usage() -> None:
    asm = StreamAssembler(chat=True)
    assert asm.feed({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) == []
    first = asm.feed({"choices": [{"index": 0, "delta": {"content": "Hi", "reasoning": "think"}}]})
    assert first[0].text == "Hi" and first[0].chat_extra == {"reasoning": "think"}
    assert asm.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) == []
    final = asm.feed({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                               "prompt_tokens_details": {"cached_tokens": 128}}})
    assert [(d.finish_reason, d.prompt_tokens, d.completion_tokens, d.cached_tokens) for d in final] == [
        ("stop", 9, 2, 128)]


def test_assembler_turns_stream_error_and_truncation_into_error_deltas() -> None:
    asm = StreamAssembler(chat=False)
    asm.feed({"choices": [{"index": 0, "text": "a", "token_ids": [1]}]})
    out = asm.feed({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
    assert out[0].finish_reason == "error" and out[0].error == "engine died"
    cut = StreamAssembler(chat=False)
    cut.feed({"choices": [{"index": 0, "text": "a"}]})
    assert cut.finish().finish_reason == "error"


def test_completion_logprobs_become_per_token_entries() -> None:
    asm = StreamAssembler(chat=False)
    out = asm.feed({"choices": [{"index": 0, "text": "a", "logprobs": {
        "tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{"a": -0.5, "b": -1.0}], "text_offset": [0]}}]})
    assert out[0].logprobs == [{"token": "a", "logprob": -0.5,
                                "top_logprobs": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.0}]}]


def test_coalesce_merges_content_runs_but_keeps_finish_and_parser_output_apart() -> None:
    from engines.base import Delta
    from engines.remote.stream import coalesce

    tool = Delta(chat_extra={"tool_calls": [{"index": 0}]}, completion_tokens=3)
    final = Delta(finish_reason="length", completion_tokens=5, prompt_tokens=9, cached_tokens=0)
    text = [Delta(text=t, token_ids=[n], completion_tokens=c) for t, n, c in (("a", 1, 1), ("b", 2, 2),
                                                                              ("c", 3, 4), ("d", 4, 5))]
    deltas = [text[0], text[1], tool, text[2], text[3], final]
    out = coalesce(deltas)
    assert [(d.text, d.token_ids, d.completion_tokens) for d in out] == [
        ("ab", [1, 2], 2), ("", [], 3), ("cd", [3, 4], 5), ("", [], 5)]
    assert out[1] is tool and out[3] is final
    with_lp = [Delta(text="x", logprobs=[{"token": "x"}]), Delta(text="y", logprobs=[{"token": "y"}]), Delta(text="z")]
    merged = coalesce(with_lp)
    assert [(d.text, d.logprobs) for d in merged] == [("xy", [{"token": "x"}, {"token": "y"}]), ("z", None)]


def test_vllm_gets_only_the_chat_fields_the_gateway_knows_and_the_tenant_salt() -> None:
    req = _request("chat")
    assert req.chat_body is not None
    req.chat_body.update({"documents": [{"text": "injected"}], "truncate_prompt_tokens": 3, "priority": -9,
                          "cache_salt": "client-picked", "continue_final_message": True})
    req.cache_salt = "tenant-salt"
    _, body = build_body(req, "vllm")
    assert not {"documents", "truncate_prompt_tokens", "priority"} & set(body)
    assert body["cache_salt"] == "tenant-salt" and body["continue_final_message"] is True
    req.cache_salt = None
    assert "cache_salt" not in build_body(req, "vllm")[1]
