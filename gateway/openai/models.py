"""GET /v1/models and /v1/models/{id}: LLMs and embedding models.

POST /tokenize and /detokenize (vLLM's extension routes).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.app_state import AppState, state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.llm.registry import LLMModel, model_not_found
from gateway.openai.prompts import check_token_ids, render_chat
from gateway.openai.schemas import DetokenizeRequest, TokenizeRequest

router = APIRouter(route_class=OffLoopJSONRoute)  # large bodies are decoded off the event loop


def _cards(st: AppState) -> dict[str, dict[str, Any]]:
    cards = {}
    for name, m in st.llm.registry.models.items():
        cards[name] = {"id": name, "object": "model", "created": m.created, "owned_by": m.owned_by,
                       "max_model_len": m.context_length}
        if m.root:
            cards[name]["root"] = m.root
    if st.embeddings is not None:
        for name, e in st.embeddings.models.items():
            cards[name] = {"id": name, "object": "model", "created": e.created, "owned_by": "sluice"}
    return cards


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    cards = _cards(state_of(request))
    return JSONResponse({"object": "list", "data": [cards[k] for k in sorted(cards)]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    card = _cards(state_of(request)).get(model_id)
    if card is None:
        raise model_not_found(model_id)
    return JSONResponse(card)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    pool = state_of(request).renderer
    model = state_of(request).llm.get(body.model)
    if body.messages is not None:
        ids = await render_chat(pool, model, body.messages, body)
    else:
        text = body.prompt or ""
        ids = await pool.tokenize(partial(model.tokenizer.encode, text, add_special_tokens=body.add_special_tokens),
                                  len(text), "prompt")
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": model.context_length})


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    model = state_of(request).llm.get(body.model)
    # Checked and decoded off the event loop when long (the body limit bounds how long).
    text = await state_of(request).renderer.tokenize(partial(_detokenize, model, body.tokens), 0, "tokens",
                                                     work=len(body.tokens))
    return JSONResponse({"prompt": text})


def _detokenize(model: LLMModel, ids: list[int]) -> str:
    check_token_ids(model, ids, "tokens", "tokens")
    return model.tokenizer.decode(ids, skip_special_tokens=False)
