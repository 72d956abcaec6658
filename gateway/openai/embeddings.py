"""POST /v1/embeddings, served by the classic repository's embedding models (see `gateway.embedding_models`)."""

from __future__ import annotations

import base64
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engines.errors import ErrorKind, SluiceError
from gateway.app_state import state_of
from gateway.json_body import OffLoopJSONRoute
from gateway.llm.registry import model_not_found
from gateway.openai.prompts import prompt_size
from gateway.openai.schemas import EmbeddingRequest
from gateway.security.access import key_id_of

router = APIRouter(route_class=OffLoopJSONRoute)  # large bodies are decoded off the event loop


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> JSONResponse:
    request.state.sluice_model = body.model
    bridge = state_of(request).embeddings
    model = bridge.models.get(body.model) if bridge else None
    if model is None or bridge is None:
        raise model_not_found(body.model)
    if body.dimensions is not None and body.dimensions != model.dimensions:
        raise SluiceError(f"this model only produces {model.dimensions}-dimensional embeddings",
                          ErrorKind.UNSUPPORTED, param="dimensions")
    chars, work = prompt_size(body.input)
    texts, tokens = await state_of(request).renderer.tokenize(partial(bridge.texts, model, body.input), chars,
                                                              "input", work=work)
    quotas, key_id = state_of(request).security.quotas, key_id_of(request)
    if key_id is not None:  # embeddings count their input tokens against the key's token quota
        await quotas.reserve_tokens(key_id, tokens)
    try:
        vectors = await bridge.embed(model, texts)
    except BaseException:
        if key_id is not None:
            quotas.refund_tokens(key_id, tokens)
        raise
    if key_id is not None:
        quotas.commit_tokens(key_id, tokens, 0)
    data = []
    for i, vec in enumerate(vectors):
        emb: Any = (base64.b64encode(vec.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else vec.tolist())
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return JSONResponse({"object": "list", "data": data, "model": model.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
