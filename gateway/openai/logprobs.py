"""Per-token logprobs in OpenAI's two shapes.

Engines deliver a list of entries `{"token", "logprob", "top_logprobs": [{"token",
"logprob"}, ...]}` (plus `bytes` when the engine sends them). Chat wraps the list as
`{"content": [...]}`; legacy completions use parallel arrays, with `top_logprobs` as a
`{token: logprob}` map per position and `text_offset` into the choice's text.
"""

from __future__ import annotations

from typing import Any


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": list(entries)} if entries else None


class CompletionLogprobs:
    """Accumulates one choice's parallel arrays; `offset` is where the next token's text starts."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict[str, float] | None] = []
        self.text_offset: list[int] = []

    def add(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Append the entries; return just their arrays (one streamed chunk's logprobs)."""
        chunk = CompletionLogprobs(self.offset)
        for entry in entries:
            token = str(entry.get("token", ""))
            tops = entry.get("top_logprobs")
            top = {str(t.get("token", "")): t.get("logprob") for t in tops} if isinstance(tops, list) else None
            for acc in (self, chunk):
                acc.tokens.append(token)
                acc.token_logprobs.append(entry.get("logprob"))
                acc.top_logprobs.append(top)
                acc.text_offset.append(acc.offset)
                acc.offset += len(token)
        return chunk.body()

    def body(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs,
                "text_offset": self.text_offset}
