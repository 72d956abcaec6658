"""GET /v1/models and /v1/models/{id}: LLMs and embedding models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.llm.registry import model_not_found
from gateway.state import AppState, state_of

router = APIRouter()


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
