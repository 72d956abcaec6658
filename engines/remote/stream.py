"""Turn a worker's OpenAI SSE chunks into Deltas (pure, no I/O).

`StreamAssembler.feed(chunk)` takes one decoded ``data:`` JSON object and returns
the Deltas it produces; `finish()` is called at ``[DONE]`` or end of stream and
returns the last Delta. The finish_reason chunk comes *before* the usage chunk
(``choices: []``), so the final Delta is held back until usage arrives or the
stream ends, and it alone carries prompt/cached token counts.
"""

from __future__ import annotations

from typing import Any, get_args

from engines.base import Delta, FinishReason
from engines.remote.errors import stream_error

_FINISH_REASONS: dict[str, FinishReason] = {r: r for r in get_args(FinishReason)}
# Chat delta keys that are not engine-parser output.
_PLAIN_DELTA_KEYS = frozenset({"role", "content"})


def _finish_reason(raw: Any) -> FinishReason:
    # Anything else (e.g. "function_call" or an engine-specific reason): the text ended normally.
    return _FINISH_REASONS.get(raw, "stop") if isinstance(raw, str) else "stop"


def completion_logprobs(raw: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """Legacy completions logprobs (parallel arrays) as per-token chat-style entries."""
    if not raw or not raw.get("tokens"):
        return None
    tops = raw.get("top_logprobs") or [None] * len(raw["tokens"])
    out = []
    for token, logprob, top in zip(raw["tokens"], raw.get("token_logprobs") or [], tops, strict=False):
        alts = [{"token": t, "logprob": lp} for t, lp in (top or {}).items()]
        out.append({"token": token, "logprob": logprob, "top_logprobs": alts})
    return out


class StreamAssembler:
    """Accumulates one request's stream; not thread-safe, one per request."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.completion_tokens = 0  # cumulative, from token ids when the worker sends them
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.usage_completion_tokens: int | None = None
        self.pending_finish: FinishReason | None = None
        self.done = False  # a final Delta has been returned
        # The prompt as the worker ran it, once it said (vLLM's `return_token_ids`: the chat chunk's top
        # level, a completion choice's), until a Delta carries it on.
        self.prompt_token_ids: list[int] | None = None
        self._prompt_said = False

    def feed(self, chunk: dict[str, Any]) -> list[Delta]:
        """Deltas produced by one chunk; after an error chunk, the stream is over."""
        if self.done:
            return []
        error = stream_error(chunk)
        if error is not None:
            self.done = True
            return [self._final("error", error=error.message)]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._take_usage(usage)
        if not self._prompt_said:
            self._take_prompt(chunk.get("prompt_token_ids"))
        out: list[Delta] = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # one engine request is one choice (the gateway fans out n)
            if not self._prompt_said:
                self._take_prompt(choice.get("prompt_token_ids"))
            delta = self._choice_delta(choice)
            if delta is not None:
                out.append(delta)
            if choice.get("finish_reason"):
                self.pending_finish = _finish_reason(choice["finish_reason"])
        if self.pending_finish is not None and isinstance(usage, dict):
            out.append(self.finish())
        return out

    def finish(self) -> Delta:
        """The final Delta: the held finish reason, or an error if the worker never sent one."""
        if self.done:
            raise RuntimeError("stream already finished")
        self.done = True
        if self.pending_finish is None:
            return self._final("error", error="worker stream ended without a finish_reason")
        return self._final(self.pending_finish)

    def _take_usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        self.usage_completion_tokens = usage.get("completion_tokens", self.usage_completion_tokens)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            self.cached_tokens = int(details["cached_tokens"])

    def _take_prompt(self, ids: Any) -> None:
        if isinstance(ids, list) and ids and all(type(t) is int and t >= 0 for t in ids):
            self.prompt_token_ids, self._prompt_said = ids, True

    def _choice_delta(self, choice: dict[str, Any]) -> Delta | None:
        extra: dict[str, Any] | None = None
        if self.chat:
            message = choice.get("delta") or {}
            text = message.get("content") or ""
            extra = {k: v for k, v in message.items() if k not in _PLAIN_DELTA_KEYS and v is not None} or None
            raw_lp = choice.get("logprobs")
            logprobs = (raw_lp or {}).get("content") if isinstance(raw_lp, dict) else None
        else:
            text = choice.get("text") or ""
            logprobs = completion_logprobs(choice.get("logprobs"))
        token_ids = list(choice.get("token_ids") or [])
        self.completion_tokens += len(token_ids) if token_ids else (1 if text or extra else 0)
        if not (text or extra or token_ids or logprobs):
            return None
        prompt, self.prompt_token_ids = self.prompt_token_ids, None
        return Delta(text=text, token_ids=token_ids, completion_tokens=self.completion_tokens,
                     chat_extra=extra, logprobs=logprobs or None, prompt_token_ids=prompt)

    def _final(self, reason: FinishReason, *, error: str | None = None) -> Delta:
        if self.usage_completion_tokens is not None:
            self.completion_tokens = self.usage_completion_tokens
        return Delta(finish_reason=reason, prompt_tokens=self.prompt_tokens,
                     completion_tokens=self.completion_tokens, cached_tokens=self.cached_tokens, error=error)


def plain(d: Delta) -> bool:
    """A Delta that only adds text (and its ids and logprobs): `coalesce` merges runs of them."""
    return d.finish_reason is None and d.chat_extra is None and d.prompt_tokens is None and d.cached_tokens is None \
        and d.prompt_token_ids is None


def coalesce(deltas: list[Delta]) -> list[Delta]:
    """Merge runs of plain content deltas (text, token ids, logprobs) into one delta each.

    Deltas that arrived in one read from the worker are relayed as one chunk: under load the
    gateway then does its per-chunk work once per read instead of once per token, and a client
    gets the same text, ids and counts. Finish, usage and parser-output (`chat_extra`) deltas
    are never merged, so tool-call fragments and the final chunk keep their own events."""
    if len(deltas) < 2:
        return deltas
    out: list[Delta] = []
    run: list[Delta] = []
    for d in deltas:
        if plain(d) and (not run or (run[0].logprobs is None) == (d.logprobs is None)):
            run.append(d)
            continue
        _flush(run, out)
        if plain(d):
            run.append(d)
        else:
            out.append(d)
    _flush(run, out)
    return out


def _flush(run: list[Delta], out: list[Delta]) -> None:
    if len(run) == 1:
        out.append(run[0])
    elif run:
        logprobs = [lp for d in run for lp in d.logprobs or ()] if run[0].logprobs is not None else None
        out.append(Delta(text="".join(d.text for d in run), token_ids=[t for d in run for t in d.token_ids],
                         completion_tokens=run[-1].completion_tokens, logprobs=logprobs))
    run.clear()
