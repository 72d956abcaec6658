"""`usage` objects, summed over the choices of one response."""

from __future__ import annotations

from typing import Any

from engines.base import Delta


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return u


class UsageTally:
    """Prompt tokens counted once per prompt, completion tokens summed over choices."""

    def __init__(self, prompt_tokens: list[int]) -> None:
        self.prompt_tokens = list(prompt_tokens)  # per prompt
        self.completion: dict[int, int] = {}
        self.cached: dict[int, int] = {}

    def add(self, index: int, prompt_index: int, delta: Delta) -> None:
        self.completion[index] = delta.completion_tokens
        if delta.prompt_tokens is not None:
            self.prompt_tokens[prompt_index] = delta.prompt_tokens
        if delta.cached_tokens is not None:
            self.cached[prompt_index] = max(self.cached.get(prompt_index, 0), delta.cached_tokens)

    def body(self) -> dict[str, Any]:
        cached = sum(self.cached.values()) if self.cached else None
        return usage(sum(self.prompt_tokens), sum(self.completion.values()), cached)
