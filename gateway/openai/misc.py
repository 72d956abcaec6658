"""Tokenize/detokenize, health, version and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import __version__
from gateway.errors import OpenAIError
from gateway.openai.chat import template_messages
from gateway.openai.schemas import DetokenizeRequest, TokenizeRequest
from gateway.state import state_of

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    model = state_of(request).llm.get(body.model)
    if body.messages is not None:
        try:
            ids = model.tokenizer.render_chat(template_messages(body.messages),
                                              add_generation_prompt=body.add_generation_prompt)
        except OpenAIError:
            raise
        except Exception as e:
            raise OpenAIError(400, f"could not apply the chat template: {e}", param="messages") from None
    else:
        ids = model.tokenizer.encode(body.prompt or "", add_special_tokens=body.add_special_tokens)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": model.context_length})


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    model = state_of(request).llm.get(body.model)
    bad = [t for t in body.tokens if not 0 <= t < model.tokenizer.vocab_size]
    if bad:
        raise OpenAIError(400, f"token id {bad[0]} is outside the vocabulary", param="tokens")
    return JSONResponse({"prompt": model.tokenizer.decode(body.tokens, skip_special_tokens=False)})


@router.get("/health")
async def health(request: Request) -> Response:
    st = state_of(request)
    ok = st.ready and st.llm.ready() and (st.classic is None or st.classic.ready())
    if ok:
        return JSONResponse({"status": "ok"})
    detail = st.startup_error or "starting"
    return JSONResponse({"status": "unavailable", "detail": detail}, status_code=503)


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(state_of(request).registry), media_type=CONTENT_TYPE_LATEST)
