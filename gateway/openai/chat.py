"""POST /v1/chat/completions: validate, render, hand to the LLM layer, build the response."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.llm.service import GenerateCall, Prompt
from gateway.openai import chat_output
from gateway.openai.params import generation_params
from gateway.openai.prompts import render_chat
from gateway.openai.schemas import ChatCompletionRequest
from gateway.openai.sse import new_id, sse, unless_disconnected
from gateway.security.access import key_id_of
from gateway.state import hints_from, state_of

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    model = st.llm.get(body.model)
    ids = await render_chat(st.renderer, model, body.messages, body)
    # The worker's own chat endpoint gets the client's body (tools, response_format,
    # vLLM extras); the validated sampling parameters are laid over it per choice.
    forward = body.model_dump(exclude_unset=True, exclude_none=True)
    forward["model"] = model.name
    call = GenerateCall(model, [Prompt(ids)], generation_params(body), new_id("chatcmpl"), kind="chat",
                        chat_body=forward, cache_salt=body.cache_salt, hints=hints_from(request),
                        key_id=key_id_of(request))
    d = await st.llm.dispatch(call)
    client_id = request.headers.get("x-request-id")
    if body.stream:
        return sse(chat_output.stream_chunks(d, body), ping_s=st.settings.sse_ping_s, headers=d.headers(client_id),
                   on_close=d.close)
    try:
        result = await unless_disconnected(request, chat_output.collect(d))
        return JSONResponse(result, headers=d.headers(client_id))
    finally:
        d.close()
