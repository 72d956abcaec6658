"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

The body is converted to the one internal conversation (`gateway.anthropic.convert`), rendered and
tokenized as chat is, so routing sees the exact tokens the engine will, and dispatched through the
same LLM layer: admission, quotas, routing, failover and cancellation on disconnect are chat's.
A remote worker gets the converted chat body at its own chat endpoint, so its tool and reasoning
parsers apply. The key may come as `x-api-key` (the security middleware reads it); the
`anthropic-version` and `anthropic-beta` headers are accepted.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.anthropic.convert import to_chat
from gateway.anthropic.schemas import CountTokensRequest, MessagesRequest
from gateway.anthropic.stream import collect, stream_events
from gateway.app_state import hints_from, state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.openai.chat import dispatch_chat
from gateway.openai.prompts import render_chat
from gateway.openai.streaming import unless_disconnected
from gateway.sse import SSEResponse

router = APIRouter(route_class=OffLoopJSONRoute)


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    d = await dispatch_chat(request, to_chat(body, stream=body.stream), f"msg_{uuid.uuid4().hex}",
                            hints_from(request))
    headers = {"request-id": d.request_id, **d.headers()}
    if body.stream:
        return SSEResponse(stream_events(d, body.stop_sequences), ping_s=st.settings.sse_ping_s, headers=headers,
                           on_close=d.close)
    try:
        return JSONResponse(await unless_disconnected(request, collect(d, body.stop_sequences)), headers=headers)
    finally:
        d.close()


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
    """The prompt's tokens as the engine will see them (the same render as /v1/messages)."""
    request.state.sluice_model = body.model
    st = state_of(request)
    model = st.llm.get(body.model)
    chat = to_chat(body)
    ids = await render_chat(st.renderer, model, chat.messages, chat)
    return JSONResponse({"input_tokens": len(ids)})
