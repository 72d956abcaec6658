"""POST /v1/completions: text, list of texts, token ids or lists of token ids."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engines.errors import ErrorKind, SluiceError
from gateway.llm.service import GenerateCall
from gateway.openai import completion_output
from gateway.openai.params import generation_params
from gateway.openai.prompts import completion_prompts, prompt_count
from gateway.openai.schemas import CompletionRequest
from gateway.openai.sse import new_id, sse, unless_disconnected
from gateway.security.access import key_id_of
from gateway.state import hints_from, state_of

router = APIRouter()


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    request.state.sluice_model = body.model
    st = state_of(request)
    model = st.llm.get(body.model)
    if body.best_of is not None and body.best_of != body.n:
        raise SluiceError("best_of different from n is not supported", ErrorKind.UNSUPPORTED, param="best_of")
    if body.suffix:
        raise SluiceError("suffix is not supported by this model", ErrorKind.UNSUPPORTED, param="suffix")
    st.llm.check_fanout(prompt_count(body.prompt), body.n)  # before tokenizing thousands of prompts
    prompts = completion_prompts(model, body.prompt)
    call = GenerateCall(model, prompts, generation_params(body), new_id("cmpl"), cache_salt=body.cache_salt,
                        hints=hints_from(request), key_id=key_id_of(request))
    d = await st.llm.dispatch(call)
    client_id = request.headers.get("x-request-id")
    if body.stream:
        return sse(completion_output.stream_chunks(d, body, prompts), ping_s=st.settings.sse_ping_s,
                   headers=d.headers(client_id), on_close=d.close)
    try:
        result = await unless_disconnected(request, completion_output.collect(d, body, prompts))
        return JSONResponse(result, headers=d.headers(client_id))
    finally:
        d.close()
