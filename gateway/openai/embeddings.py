"""POST /v1/embeddings, served by embedding models of the classic repository.

A repository model is offered here when its config.pbtxt carries
`parameters { key: "openai_task" value { string_value: "embeddings" } }`; it
takes a BYTES input `TEXT` and returns FP32 `EMBEDDING` rows. Requests go
through that model's dynamic batcher like any KServe request.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from engines.errors import SluiceError
from gateway.errors import OpenAIError, model_not_found
from gateway.openai.schemas import EmbeddingRequest
from gateway.state import state_of

router = APIRouter()


@dataclass(slots=True)
class EmbeddingModel:
    name: str
    tokenizer: Any  # tokenizers.Tokenizer, for usage counts and length checks
    max_input_tokens: int
    dimensions: int
    created: int


class EmbeddingBridge:
    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.models: dict[str, EmbeddingModel] = {}

    @classmethod
    def discover(cls, manager: Any, repository: Path) -> EmbeddingBridge:
        from google.protobuf import text_format
        from tokenizers import Tokenizer
        from tritonclient.grpc import model_config_pb2

        from engines.weights import resolve_weights

        bridge = cls(manager)
        for cfg_path in sorted(Path(repository).glob("*/config.pbtxt")):
            cfg = model_config_pb2.ModelConfig()
            try:
                text_format.Parse(cfg_path.read_text(), cfg)
            except text_format.ParseError:
                continue  # the repository manager reports broken configs
            params = {k: v.string_value for k, v in cfg.parameters.items()}
            if params.get("openai_task") != "embeddings":
                continue
            name = cfg.name or cfg_path.parent.name
            tok_dir = resolve_weights(params["tokenizer"], cfg_path.parent, name)
            tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
            tok.no_truncation()
            dims = int(params.get("dimensions", "384"))
            max_tokens = int(params.get("max_input_tokens", "512"))
            bridge.models[name] = EmbeddingModel(name, tok, max_tokens, dims, int(cfg_path.stat().st_mtime))
        return bridge

    def texts(self, model: EmbeddingModel, body: EmbeddingRequest) -> tuple[list[str], int]:
        raw = body.input
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif raw and all(isinstance(t, int) for t in raw):
            items = [raw]
        else:
            items = list(raw)
        texts, total = [], 0
        for i, item in enumerate(items):
            if isinstance(item, list):
                text = model.tokenizer.decode(item, skip_special_tokens=True)
            else:
                text = item
            if not text:
                raise OpenAIError(400, f"input[{i}] is empty", param="input")
            n = len(model.tokenizer.encode(text).ids)
            if n > model.max_input_tokens:
                raise OpenAIError(400, f"input[{i}] has {n} tokens; this model's maximum is "
                                  f"{model.max_input_tokens}", code="context_length_exceeded", param="input")
            texts.append(text)
            total += n
        return texts, total


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> JSONResponse:
    request.state.sluice_model = body.model
    bridge: EmbeddingBridge | None = state_of(request).embeddings
    model = bridge.models.get(body.model) if bridge else None
    if model is None or bridge is None:
        raise model_not_found(body.model)
    if body.dimensions is not None and body.dimensions != model.dimensions:
        raise OpenAIError(400, f"this model only produces {model.dimensions}-dimensional embeddings",
                          param="dimensions")
    texts, tokens = bridge.texts(model, body)
    try:
        rows = np.array(texts, dtype=object).reshape(-1, 1)  # batched model: [N, 1] per Triton's rules
        out = await bridge.manager.infer(model.name, "", {"TEXT": rows}, ["EMBEDDING"])
    except SluiceError as e:  # the repository manager reports unavailable/queue-full models
        raise OpenAIError.from_engine(e) from None
    vectors = np.asarray(out["EMBEDDING"], dtype=np.float32)
    data = []
    for i, vec in enumerate(vectors):
        emb: Any = (base64.b64encode(vec.astype("<f4").tobytes()).decode() if body.encoding_format == "base64"
                    else vec.tolist())
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return JSONResponse({"object": "list", "data": data, "model": model.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
