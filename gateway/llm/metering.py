"""The LLM layer's seam to per-key token quotas (implemented by `gateway.security.quotas.QuotaService`).

`LLMService.dispatch` calls `reserve_tokens` with a request's prompt tokens before
it ranks and admits (the only await of a dispatch), `refund_tokens` if the request
is then refused before it runs, and `commit_tokens` exactly once when its
`Dispatch` closes, with the completion tokens it produced.
"""

from __future__ import annotations

from typing import Protocol


class TokenQuota(Protocol):
    async def reserve_tokens(self, key_id: str, tokens: int) -> None:
        """Charge `tokens` to the key, or raise SluiceError(RATE_LIMITED, retry_after_s=...) if they do not fit now."""
        ...

    def refund_tokens(self, key_id: str, tokens: int) -> None:
        """Give back a reservation whose request never ran. Never blocks or raises."""
        ...

    def commit_tokens(self, key_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Record a finished request's usage and charge its completion tokens. Never blocks or raises."""
        ...
