"""Embedding models of the classic repository, offered to OpenAI clients.

A repository model is offered here when its config.pbtxt carries
`parameters { key: "openai_task" value { string_value: "embeddings" } }`; it
takes a BYTES input `TEXT` and returns FP32 `EMBEDDING` rows. Requests go
through that model's dynamic batcher like any KServe request, split into
batches of the model's `max_batch_size` (OpenAI accepts 2,048 inputs).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.errors import ErrorKind, SluiceError

if TYPE_CHECKING:
    from engines.classic.manager import ModelRepositoryManager



@dataclass(slots=True)
class EmbeddingModel:
    name: str
    tokenizer: Any  # tokenizers.Tokenizer, for usage counts and length checks
    max_input_tokens: int
    dimensions: int
    created: int
    max_batch_size: int  # rows per infer call: larger requests are split


class EmbeddingBridge:
    def __init__(self, manager: ModelRepositoryManager) -> None:
        self.manager = manager
        self.models: dict[str, EmbeddingModel] = {}

    @classmethod
    def discover(cls, manager: ModelRepositoryManager) -> EmbeddingBridge:
        """Every loaded model whose config offers it as an OpenAI embeddings model
        (read from the configs the repository manager already parsed)."""
        from tokenizers import Tokenizer

        from engines.weights import resolve_weights

        bridge = cls(manager)
        for name in manager.model_names():
            try:
                cfg = manager.model_config(name)
            except SluiceError:
                continue  # not ready: the repository index reports why
            params = {k: v.string_value for k, v in cfg.parameters.items()}
            if params.get("openai_task") != "embeddings":
                continue
            tok_dir = resolve_weights(params["tokenizer"], manager.repo_dir / name, name)
            tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
            tok.no_truncation()
            tok.no_padding()  # the shipped tokenizer.json pads to 128: usage and quotas count real tokens
            bridge.models[name] = EmbeddingModel(
                name, tok, int(params.get("max_input_tokens", "512")), int(params.get("dimensions", "384")),
                int((manager.repo_dir / name / "config.pbtxt").stat().st_mtime), max(1, cfg.max_batch_size))
        return bridge

    def texts(self, model: EmbeddingModel, raw: str | list[Any]) -> tuple[list[str], int]:
        """OpenAI's four input forms (text, texts, ids, lists of ids) as texts, and their token count.
        CPU work that grows with the input: the route runs it off the event loop (`gateway.cpu_pool`)."""
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif raw and all(isinstance(t, int) for t in raw):
            items = [raw]
        else:
            items = list(raw)
        texts = []
        for i, item in enumerate(items):
            text = self._decode(model, item, i) if isinstance(item, list) else item
            if not text:
                raise SluiceError(f"input[{i}] is empty", ErrorKind.INVALID_ARG, param="input")
            texts.append(text)
        # encode_batch: the tokenizers binding releases the GIL there (not in encode), and uses every core.
        counts = [len(e.ids) for e in model.tokenizer.encode_batch(texts)]
        for i, n in enumerate(counts):
            if n > model.max_input_tokens:
                raise SluiceError(f"input[{i}] has {n} tokens; this model's maximum is {model.max_input_tokens}",
                                  ErrorKind.CONTEXT_TOO_LONG, code="context_length_exceeded", param="input")
        return texts, sum(counts)

    @staticmethod
    def _decode(model: EmbeddingModel, ids: list[int], i: int) -> str:
        """The text of token ids, each checked against the vocabulary first (the tokenizer takes only
        unsigned 32-bit ids, and silently drops ids past its vocabulary)."""
        vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise SluiceError(f"input[{i}]: token id {bad} is outside the vocabulary [0, {vocab})",
                              ErrorKind.INVALID_ARG, param="input")
        return str(model.tokenizer.decode(ids, skip_special_tokens=True))


    async def embed(self, model: EmbeddingModel, texts: list[str]) -> np.ndarray:
        """[len(texts), dims] float32, in model-sized batches through the model's batcher."""
        rows = np.array(texts, dtype=object).reshape(-1, 1)  # batched model: [N, 1] per Triton's rules
        step = model.max_batch_size
        parts = [self.manager.infer(model.name, "", {"TEXT": rows[i:i + step]}, ["EMBEDDING"])
                 for i in range(0, len(rows), step)]
        outputs = await asyncio.gather(*parts)
        return np.concatenate([np.asarray(o["EMBEDDING"], dtype=np.float32) for o in outputs])
