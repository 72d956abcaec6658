"""POST /tokenize and /detokenize (vLLM's extension routes)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.openai.prompts import check_token_ids, render_chat
from gateway.openai.schemas import DetokenizeRequest, TokenizeRequest
from gateway.state import state_of

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    model = state_of(request).llm.get(body.model)
    if body.messages is not None:
        ids = await render_chat(state_of(request).renderer, model, body.messages, body)
    else:
        ids = model.tokenizer.encode(body.prompt or "", add_special_tokens=body.add_special_tokens)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": model.context_length})


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    model = state_of(request).llm.get(body.model)
    check_token_ids(model, body.tokens, "tokens", "tokens")
    return JSONResponse({"prompt": model.tokenizer.decode(body.tokens, skip_special_tokens=False)})
