"""Where a lost stream resumes, and the request that resumes it (pure, but for the tokenizer's decode).

See the package docstring for the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import orjson

from engines.base import Delta, EngineRequest
from engines.text.detokenizer import prompt_context

# Tokens dropped from the end at most while their text is an incomplete character (UTF-8: 3 bytes).
_MAX_HELD_BACK = 4
# With stop strings, tokens dropped from the end at most to find the boundary where the ids' text is
# exactly the client's (the engine holds back text that could start a stop string).
_MAX_STOP_BACK = 16
# Chat body fields that make the engine hold parser or grammar state across a stream.
_STATEFUL_CHAT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex",
                         "guided_choice", "guided_grammar")


@dataclass(frozen=True, slots=True)
class MigrationConfig:
    """`--max-migrations`: times one choice may move to another worker (0: a lost worker's stream ends
    with an error event). `--max-migration-replay-tokens`: the most committed answer tokens a resume
    replays as prompt; a longer answer is not moved (its prefill would cost the new worker more
    than the answer left)."""

    max_migrations: int = 3
    max_replay_tokens: int = 32768

    def __post_init__(self) -> None:
        if not 0 <= self.max_migrations <= 16:
            raise ValueError(f"max_migrations must be within 0..16, got {self.max_migrations}")
        if self.max_replay_tokens < 1:
            raise ValueError(f"max_replay_tokens must be >= 1, got {self.max_replay_tokens}")


class Detokenizer(Protocol):
    eos_token_id: int | None

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


@dataclass(slots=True)
class Sent:
    """What one choice's client has been sent, and what the engines said about it."""

    ids: list[int] = field(default_factory=list)
    pieces: list[str | bytes] = field(default_factory=list)  # text, or JSON string bodies (text_json)
    worker_prompt: list[int] | None = None  # the prompt ids the first worker reported running
    any: bool = False  # a delta reached the client
    missing_ids: bool = False  # text came without token ids: the worker does not send them
    parser_output: bool = False  # tool calls or reasoning from the engine's parsers
    migrations: int = 0
    last_at: float = 0.0  # when the client last got a delta (the pause of a resume starts here)

    def add(self, delta: Delta, now: float) -> None:
        self.any = True
        self.last_at = now
        if delta.text_json is not None:
            self.pieces.append(delta.text_json)
        elif delta.text:
            self.pieces.append(delta.text)
        if delta.token_ids:
            self.ids.extend(delta.token_ids)
        elif delta.text or delta.text_json:
            self.missing_ids = True
        if delta.chat_extra:
            self.parser_output = True
        if delta.prompt_token_ids is not None and self.worker_prompt is None:
            self.worker_prompt = delta.prompt_token_ids

    def text(self) -> str:
        return "".join(p if isinstance(p, str) else json_text(p) for p in self.pieces)


def json_text(body: bytes) -> str:
    """The text of a JSON string body (`Delta.text_json`: no quotes, as orjson writes it)."""
    text: str = orjson.loads(b'"' + body + b'"')
    return text


@dataclass(frozen=True, slots=True)
class ResumePoint:
    committed: list[int]  # the ids the resume replays after the prompt
    owed: str  # text of those ids the client has not been sent yet
    # Text the client already has beyond them: the whole characters of a token rolled back for the
    # incomplete one it ends with (an engine that sends them early); the resumed stream's start drops it.
    ahead: str = ""


def refusal(request: EngineRequest, sent: Sent) -> str | None:
    """Why this choice cannot be resumed from tokens, or None."""
    body = request.chat_body or {}
    if sent.parser_output or (body.get("tools") and body.get("tool_choice") != "none"):
        return "parser_state"
    if any(body.get(k) is not None for k in _STATEFUL_CHAT_FIELDS):
        return "structured_output"
    if sent.missing_ids:
        return "no_token_ids"
    return None


def resume_point(tokenizer: Detokenizer, prompt: list[int], sent: Sent, has_stops: bool,
                 greedy: bool = True) -> ResumePoint | str:
    """The committed ids and the owed text, or why the client's text and the ids disagree. `greedy`:
    the rolled-back tokens are generated again as they were, so text already sent of them is `ahead`."""
    context = prompt_context(tokenizer.decode, prompt)
    base = tokenizer.decode(context)
    text = sent.text()
    keep = len(sent.ids)
    for _ in range(_MAX_HELD_BACK + 1):
        decoded = _text_after(tokenizer, context, base, sent.ids[:keep])
        if decoded is None:
            return "text_mismatch"
        if not decoded.endswith("\ufffd") or keep == 0:
            break
        keep -= 1  # an incomplete character: its tokens are generated again
    else:
        return "text_mismatch"
    if not decoded.startswith(text):
        return _ahead_point(tokenizer, context, base, sent, text, keep, decoded, greedy)
    owed = decoded[len(text):]
    if owed and has_stops:
        # Text held back behind whole tokens may be the start of a stop string the next worker must see:
        # go back to the last token whose text the client has whole, and let those tokens be generated again.
        for back in range(keep - 1, max(-1, keep - 1 - _MAX_STOP_BACK), -1):
            if _text_after(tokenizer, context, base, sent.ids[:back]) == text:
                return ResumePoint(sent.ids[:back], "")
        return "stop_pending"
    return ResumePoint(sent.ids[:keep], owed)


def _ahead_point(tokenizer: Detokenizer, context: list[int], base: str, sent: Sent, text: str, keep: int,
                 decoded: str, greedy: bool) -> ResumePoint | str:
    """Rolled back to `keep` ids (text `decoded`) while the client has more: the whole characters the
    rolled-back ids decode to before their incomplete one (the client's `text`). Only a greedy answer
    regenerates them as sent."""
    whole = _text_after(tokenizer, context, base, sent.ids)
    if (not greedy or keep == len(sent.ids) or whole is None or not text.startswith(decoded)
            or not whole.rstrip("\ufffd").startswith(text)):
        return "text_mismatch"
    return ResumePoint(sent.ids[:keep], "", text[len(decoded):])


def _text_after(tokenizer: Detokenizer, context: list[int], base: str, ids: list[int]) -> str | None:
    """The text of `ids` after `context` (whose own text is `base`), or None if the decodes disagree."""
    full = tokenizer.decode(context + ids)
    return full[len(base):] if full.startswith(base) else None


def resume_request(origin: EngineRequest, prompt: list[int], committed: list[int], step: int) -> EngineRequest:
    """`origin` as a token-id completion that carries on after `committed`."""
    sp = origin.sampling
    done = len(committed)
    sampling = replace(sp, max_tokens=sp.max_tokens - done, min_tokens=max(0, sp.min_tokens - done))
    return replace(origin, request_id=f"{origin.request_id}~{step}", prompt_token_ids=prompt + committed,
                   sampling=sampling, kind="completion", chat_body=None, trace_headers=None)


def ended_already(origin: EngineRequest, committed: list[int], eos: int | None) -> Delta | None:
    """The final Delta when the committed ids already end the answer (its last token stops it, or
    `max_tokens` is reached) and only the worker's final event was lost; else None."""
    sp = origin.sampling
    done = len(committed)
    if done >= sp.max_tokens:
        return Delta(finish_reason="length", completion_tokens=done)
    stops = set(sp.stop_token_ids) | ({eos} if eos is not None and not sp.ignore_eos else set())
    if committed and committed[-1] in stops and done >= sp.min_tokens:
        return Delta(finish_reason="stop", completion_tokens=done)
    return None


@dataclass(slots=True)
class Resumed:
    """Turns a resumed attempt's deltas into the original stream's: counts run on from the committed
    tokens, and usage names the original prompt."""

    committed: int
    prompt_tokens: int
    ahead: str = ""  # the client has this text already (`ResumePoint.ahead`): dropped from the start

    def adjust(self, delta: Delta) -> Delta:
        if self.ahead and (delta.text or delta.text_json is not None):
            self._drop_ahead(delta)
        delta.completion_tokens += self.committed
        delta.prompt_token_ids = None
        if delta.prompt_tokens is not None:
            delta.prompt_tokens = self.prompt_tokens
            if delta.cached_tokens is not None:
                delta.cached_tokens = min(delta.cached_tokens, self.prompt_tokens)
        return delta

    def _drop_ahead(self, delta: Delta) -> None:
        text = delta.text if delta.text_json is None else json_text(delta.text_json)
        same = next((i for i, (a, b) in enumerate(zip(text, self.ahead, strict=False)) if a != b),
                    min(len(text), len(self.ahead)))
        # A greedy answer regenerates the dropped text exactly; were it to differ, what the client
        # has is kept and the new text goes on after the common part.
        self.ahead = self.ahead[same:] if same == len(text) else ""
        delta.text, delta.text_json = text[same:], None
