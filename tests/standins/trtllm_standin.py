"""STAND-IN for `trtllm-serve` (TensorRT-LLM needs an NVIDIA GPU; none is available here).

This is NOT TensorRT-LLM and generates no real text. It reproduces the HTTP shapes
trtllm-serve documents, so Sluice's launcher and RemoteEngine can be tested:
- the CLI: ``MODEL --host --port --backend --tp_size --pp_size --max_seq_len
  --extra_llm_api_options YAML`` (it reads ``kv_cache_config`` from the YAML);
- ``/v1/completions`` and ``/v1/chat/completions`` (SSE, usage chunk, cached tokens)
  with request models that forbid unknown fields, like trtllm-serve's pydantic models;
- the flat error body ``{"object": "error", "message", "type", "param", "code"}``;
- ``POST /kv_cache_events`` (drains ``stored``/``removed`` events, blocks of 32 tokens);
- ``GET /health``, ``GET /version``, ``GET /v1/models`` and JSON ``GET /metrics``;
- with ``$SLUICE_WORKER_KEY`` set (what `sluice worker --engine trtllm` passes), every route
  but ``/health`` and ``/metrics`` needs it as a bearer key (`engines.launchers.worker_guard`).

Test controls (stand-in only): header ``X-Standin-Fault: html-500 | midstream-error |
midstream-close | midstream-bad-bytes`` (the last: an event in the stream's own layout whose text
is not UTF-8), or a chat whose last message is ``standin-fault: NAME`` (what a gateway forwards),
and ``--token-delay-s``. Token "generation" is arithmetic on ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engines.launchers.worker_guard import WorkerKeyGuard

TOKENS_PER_BLOCK = 32
_SAMPLING = {"max_tokens", "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
             "n", "user", "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "min_tokens",
             "include_stop_str_in_output", "skip_special_tokens", "stream", "stream_options", "model"}
COMPLETION_FIELDS = _SAMPLING | {"prompt", "logprobs", "echo"}
CHAT_FIELDS = _SAMPLING | {"messages", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs",
                           "max_completion_tokens", "chat_template_kwargs"}


def flat_error(message: str, status: int, err_type: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": err_type, "param": None, "code": status},
                        status_code=status)


class StandinState:
    """Prefix-cache bookkeeping and KV events, in trtllm's JSON event shapes."""

    def __init__(self, model: str, max_seq_len: int, options: dict[str, Any], token_delay_s: float) -> None:
        kv = options.get("kv_cache_config") or {}
        self.model, self.max_seq_len, self.token_delay_s = model, max_seq_len, token_delay_s
        self.reuse = bool(kv.get("enable_block_reuse", False))
        self.buffer_max = int(kv.get("event_buffer_max_size", 0))
        self.blocks: set[int] = set()
        self.events: list[dict[str, Any]] = []
        self.next_event_id = 0
        self.running = 0
        self.iteration = 0
        self._emit({"type": "created", "num_blocks_per_cache_level": [4096, 0]})

    def _emit(self, data: dict[str, Any]) -> None:
        if self.buffer_max > 0:  # trtllm keeps no events without a buffer
            self.events.append({"event_id": self.next_event_id, "data": data, "window_size": self.max_seq_len})
            self.events = self.events[-self.buffer_max:]
        self.next_event_id += 1

    def prefill(self, ids: list[int]) -> int:
        """Store the prompt's full blocks; return cached tokens (leading blocks already held)."""
        cached, parent, hit = 0, None, True
        for start in range(0, len(ids) - len(ids) % TOKENS_PER_BLOCK, TOKENS_PER_BLOCK):
            block = tuple(ids[start:start + TOKENS_PER_BLOCK])
            block_hash = hash((parent, block)) & 0x7FFFFFFFFFFFFFFF
            if hit and self.reuse and block_hash in self.blocks:
                cached += TOKENS_PER_BLOCK
            else:
                hit = False
                if self.reuse and block_hash not in self.blocks:
                    self.blocks.add(block_hash)
                    tokens = [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in block]
                    self._emit({"type": "stored", "parent_hash": parent, "blocks": [
                        {"type": "stored_block", "block_hash": block_hash, "tokens": tokens,
                         "cache_level": 0, "priority": 35}]})
            parent = block_hash
        return cached


def chat_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The stand-in's "tokenizer": one id per UTF-8 byte of the contents."""
    text = "".join(str(m.get("content") or "") for m in messages)
    return list(text.encode())


def make_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": "standin"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model, "object": "model", "owned_by": "tensorrt_llm"}]}

    @app.get("/metrics")
    async def metrics() -> list[dict[str, Any]]:
        state.iteration += 1
        return [{"iter": state.iteration, "numActiveRequests": state.running, "maxNumActiveRequests": 64,
                 "kvCacheStats": {"tokensPerBlock": TOKENS_PER_BLOCK, "usedNumBlocks": len(state.blocks)}}]

    @app.post("/kv_cache_events")
    async def kv_cache_events() -> list[dict[str, Any]]:
        drained, state.events = state.events, []
        return drained

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(state, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _generate(state, request, chat=True)

    return app


async def _generate(state: StandinState, request: Request, *, chat: bool) -> Response:
    try:
        body = await request.json()
    except ValueError:
        return flat_error("invalid JSON body", 400)
    unknown = sorted(set(body) - (CHAT_FIELDS if chat else COMPLETION_FIELDS))
    if unknown:  # trtllm-serve's request models use extra="forbid"
        return flat_error(f"Extra inputs are not permitted: {unknown}", 400)
    fault = request.headers.get("x-standin-fault", "")
    last = str(((body.get("messages") or [{}])[-1] or {}).get("content") or "") if chat else ""
    if last.startswith("standin-fault: "):
        fault = last.removeprefix("standin-fault: ")
    if fault == "html-500":
        return Response("<html><body>502 Bad Gateway</body></html>", status_code=500, media_type="text/html")
    prompt = chat_ids(body.get("messages") or []) if chat else body.get("prompt")
    if isinstance(prompt, str):
        prompt = list(prompt.encode())
    if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
        return flat_error("prompt must be a string or a list of token ids", 400)
    max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    if len(prompt) + max_tokens > state.max_seq_len:
        return flat_error(f"prompt length {len(prompt)} + max_tokens {max_tokens} exceeds max_seq_len "
                          f"{state.max_seq_len}", 400)
    cached = state.prefill(prompt)
    usage_wanted = bool((body.get("stream_options") or {}).get("include_usage", True))
    chunks = _chunks(state, prompt, max_tokens, cached, chat=chat, usage=usage_wanted, fault=fault)
    if body.get("stream"):
        return StreamingResponse(chunks, media_type="text/event-stream")
    return flat_error("the stand-in only streams", 400)


async def _chunks(state: StandinState, prompt: list[int], max_tokens: int, cached: int, *, chat: bool,
                  usage: bool, fault: str) -> AsyncIterator[str | bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": f"standin-{time.monotonic_ns()}", "object": obj, "created": int(time.time()), "model": state.model}

    def event(choice: dict[str, Any] | None, **extra: Any) -> str:
        return f"data: {json.dumps(base | {'choices': [choice] if choice else []} | extra)}\n\n"

    def bad_bytes() -> bytes:  # a text event as the others, its text's bytes not UTF-8
        choice = {"index": 0, "delta": {"content": "BAD"}, "finish_reason": None} if chat else \
            {"index": 0, "text": "BAD", "token_ids": [1], "finish_reason": None}
        return event(choice).encode().replace(b'"BAD"', b'" t\xff"')

    state.running += 1
    try:
        if chat:
            yield event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        for i in range(max_tokens):
            await asyncio.sleep(state.token_delay_s)
            if i == 2 and fault == "midstream-error":
                fault_body = {"object": "error", "message": "standin engine fault", "type": "InternalServerError",
                              "param": None, "code": 500}
                yield f"data: {json.dumps(fault_body)}\n\n"
                return
            if i == 2 and fault == "midstream-close":
                raise RuntimeError("stand-in drops the connection")  # uvicorn closes the socket
            if i == 3 and fault == "midstream-bad-bytes":
                yield bad_bytes()
                continue
            token = (sum(prompt) + i) % 1000
            finish = "length" if i == max_tokens - 1 else None
            piece = f" t{token}"
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": finish} if chat
                      else {"index": 0, "text": piece, "token_ids": [token], "finish_reason": finish})
            yield event(choice)
        if usage:
            yield event(None, usage={"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                                     "total_tokens": len(prompt) + max_tokens,
                                     "prompt_tokens_details": {"cached_tokens": cached}})
        yield "data: [DONE]\n\n"
    finally:
        state.running -= 1  # also on client disconnect (the generator is cancelled)


def main() -> None:
    parser = argparse.ArgumentParser(description="STAND-IN for trtllm-serve (not TensorRT-LLM)")
    parser.add_argument("words", nargs="+", help="[serve] MODEL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--backend", default="pytorch")
    parser.add_argument("--tp_size", type=int, default=1)
    parser.add_argument("--pp_size", type=int, default=1)
    parser.add_argument("--max_seq_len", type=int, default=4096)
    parser.add_argument("--extra_llm_api_options", "--config", default=None)
    parser.add_argument("--token-delay-s", type=float, default=0.01)
    args = parser.parse_args()
    options = yaml.safe_load(Path(args.extra_llm_api_options).read_text()) if args.extra_llm_api_options else {}
    state = StandinState(args.words[-1], args.max_seq_len, options or {}, args.token_delay_s)
    key = os.environ.get("SLUICE_WORKER_KEY")
    app = WorkerKeyGuard(make_app(state), key) if key else make_app(state)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
