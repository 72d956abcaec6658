"""OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, and
`GET /v1/responses/{id}/input_items`.

A request is expanded (its `previous_response_id` from the gateway's store), converted onto the
chat request the chat route builds, rendered and dispatched through the same LLM layer, so
routing by the exact tokens, admission, quotas, failover, a worker's own tool and reasoning
parsers and cancellation on disconnect are chat's. A continuation carries its conversation's
first response id as its session key (unless the client sent the session header or a
`prompt_cache_key`), so the session-affinity policy keeps a conversation on one worker, and
prefix routing finds the worker that holds its growing prefix anyway. With `store` (the
default), the response, its input items and the conversation are kept (`store.py`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from gateway.app_state import hints_from, state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.llm.dispatch import Dispatch
from gateway.openai.chat import dispatch_chat, raise_if_failed
from gateway.openai.errors import error_body
from gateway.openai.responses.convert import assistant_turn, input_items, new_id, to_chat
from gateway.openai.responses.events import Assembler, usage
from gateway.openai.responses.schemas import ResponsesRequest
from gateway.openai.streaming import unless_disconnected
from gateway.response_store import ResponseStore, Stored
from gateway.security.access import key_id_of
from gateway.sse import SSEResponse

router = APIRouter(route_class=OffLoopJSONRoute)

_ECHOED = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id",
           "temperature", "top_p", "tool_choice", "tools", "text", "truncation", "store", "user", "prompt_cache_key",
           "safety_identifier", "service_tier")


class Turn:
    """One response being made: what it answers, and what it will store."""

    def __init__(self, body: ResponsesRequest, d: Dispatch, owner: str, history: list[dict[str, Any]],
                 root: str) -> None:
        self.body, self.d, self.owner, self.history, self.root = body, d, owner, history, root
        self.id, self.created_at = d.request_id, int(time.time())
        self.prompt = len(d.requests[0].prompt_token_ids)

    def response(self, asm: Assembler, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        echoed = self.body.model_dump(include=set(_ECHOED), by_alias=True)
        final = asm.final
        incomplete = {"reason": "max_output_tokens"} if final is not None and final.finish_reason == "length" else None
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.d.model.name, "output": asm.output, "error": error, "incomplete_details": incomplete,
                "usage": usage(final, self.prompt) if status != "in_progress" else None,
                "reasoning": {"effort": None, "summary": None}, **echoed,
                "parallel_tool_calls": self.body.parallel_tool_calls is not False,
                "tool_choice": self.body.tool_choice or "auto", "tools": echoed.get("tools") or [],
                "text": echoed.get("text") or {"format": {"type": "text"}}}

    def status(self, asm: Assembler) -> str:
        return "incomplete" if asm.final is not None and asm.final.finish_reason == "length" else "completed"

    async def keep(self, request: Request, asm: Assembler, response: dict[str, Any]) -> None:
        if not self.body.store:
            return
        conversation = [*self.history, assistant_turn(asm.text, asm.calls)]
        await store_of(request).put(Stored(
            id=self.id, owner=self.owner, response=response, input_items=input_items(self.body),
            conversation=conversation, root=self.root, worker=self.d.headers().get("X-Sluice-Worker")))


def store_of(request: Request) -> ResponseStore:
    return state_of(request).responses


async def _previous(request: Request, body: ResponsesRequest, owner: str) -> Stored | None:
    if body.previous_response_id is None:
        return None
    prev = await store_of(request).get(body.previous_response_id, owner)
    if prev is None:
        raise SluiceError(f"Previous response with id '{body.previous_response_id}' not found.", ErrorKind.NOT_FOUND,
                          param="previous_response_id")
    return prev


@router.post("/v1/responses")
async def create(body: ResponsesRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    st.llm.get(body.model)  # an unknown model is a 404 before the store is read
    owner = key_id_of(request) or ""
    prev = await _previous(request, body, owner)
    root = prev.root if prev is not None else None
    chat, conversation = to_chat(body, prev.conversation if prev is not None else [])
    rid = new_id("resp")
    hints = hints_from(request)
    if hints.session_key is None and (body.prompt_cache_key or root):
        hints = replace(hints, session_key=body.prompt_cache_key or root)
    if prev is not None and prev.worker:
        hints = replace(hints, prefer_worker=prev.worker)
    d = await dispatch_chat(request, chat, rid, hints)
    turn = Turn(body, d, owner, conversation, root or rid)
    if body.stream:
        return SSEResponse(_events(turn, request), ping_s=st.settings.sse_ping_s, headers=d.headers(),
                           on_close=d.close)
    try:
        return JSONResponse(await unless_disconnected(request, _collect(turn, request)), headers=d.headers())
    finally:
        d.close()


async def _collect(turn: Turn, request: Request) -> dict[str, Any]:
    asm = Assembler(streaming=False)
    async with aclosing(turn.d.deltas()) as deltas:
        async for _, delta in deltas:
            raise_if_failed(delta)
            asm.feed(delta)
    asm.finish()
    response = turn.response(asm, turn.status(asm))
    await turn.keep(request, asm, response)
    return response


async def _events(turn: Turn, request: Request) -> AsyncGenerator[bytes, None]:
    asm = Assembler(streaming=True)
    asm.event("response.created", response=turn.response(asm, "in_progress"))
    asm.event("response.in_progress", response=turn.response(asm, "in_progress"))
    for event in asm.take():
        yield event
    try:
        async with aclosing(turn.d.deltas()) as deltas:
            async for _, delta in deltas:
                raise_if_failed(delta)
                asm.feed(delta)
                for event in asm.take():
                    yield event
    except Exception as e:
        asm.finish()
        failure = error_body(e)["error"]
        asm.event("response.failed", response=turn.response(asm, "failed", {
            "code": failure.get("code") or "server_error", "message": failure["message"]}))
        for event in asm.take():
            yield event
        return
    asm.finish()
    status = turn.status(asm)
    response = turn.response(asm, status)
    await turn.keep(request, asm, response)
    asm.event(f"response.{status}", response=response)
    for event in asm.take():
        yield event


async def _stored(request: Request, response_id: str) -> Stored:
    rec = await store_of(request).get(response_id, key_id_of(request) or "")
    if rec is None:
        raise SluiceError(f"Response with id '{response_id}' not found.", ErrorKind.NOT_FOUND, param="response_id")
    return rec


@router.get("/v1/responses/{response_id}")
async def retrieve(response_id: str, request: Request) -> Response:
    return JSONResponse((await _stored(request, response_id)).response)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request) -> Response:
    if not await store_of(request).delete(response_id, key_id_of(request) or ""):
        raise SluiceError(f"Response with id '{response_id}' not found.", ErrorKind.NOT_FOUND, param="response_id")
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, limit: int = Query(20, ge=1, le=100),
                           order: str = Query("desc", pattern="^(asc|desc)$"),
                           after: str | None = Query(None, max_length=128)) -> Response:
    items = list((await _stored(request, response_id)).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [i.get("id") for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit})

