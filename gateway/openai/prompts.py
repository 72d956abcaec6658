"""OpenAI prompts to token ids: chat messages through the model's own template, and the
four completion prompt forms. `/v1/chat/completions` and `/tokenize` share `render_chat`,
so both produce exactly the ids the engine is sent."""

from __future__ import annotations

from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.llm.registry import LLMModel
from gateway.llm.service import Prompt
from gateway.openai.schemas import ChatMessage, ChatTemplateFields


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts a chat template expects.

    `developer` is treated as `system`; text parts are joined; non-text parts are
    refused (these are text-only models)."""
    out = []
    for i, m in enumerate(messages):
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise SluiceError(f"messages[{i}]: content part type {part.type!r} is not supported by this "
                                      "model (text only)", ErrorKind.UNSUPPORTED, param=f"messages.{i}.content")
                texts.append(part.text)
            content = "\n".join(texts)
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            value = getattr(m, key)
            if value is not None:
                msg[key] = value
        out.append(msg)
    return out


def render_chat(model: LLMModel, messages: list[ChatMessage], body: ChatTemplateFields) -> list[int]:
    """Token ids of the conversation as the engine will see them."""
    try:
        return model.tokenizer.render_chat(
            template_messages(messages),
            tools=body.tools,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            template_kwargs=body.chat_template_kwargs,
        )
    except SluiceError:
        raise
    except Exception as e:  # template errors are the caller's (bad roles, bad tool schema)
        raise SluiceError(f"could not apply the chat template: {e}", ErrorKind.INVALID_ARG,
                          param="messages") from None


def _prompt_items(prompt: Any) -> list[Any]:
    if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
        return [prompt]
    return list(prompt)


def prompt_count(prompt: Any) -> int:
    return len(_prompt_items(prompt))


def completion_prompts(model: LLMModel, prompt: Any) -> list[Prompt]:
    """Normalise the four prompt forms (text, texts, ids, lists of ids) into Prompts."""
    items = _prompt_items(prompt)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            ids = model.tokenizer.encode(item)
            if not ids:
                raise SluiceError(f"prompt {i} is empty after tokenization", ErrorKind.INVALID_ARG, param="prompt")
            out.append(Prompt(ids, item))
        else:
            check_token_ids(model, item, f"prompt {i}", "prompt")
            out.append(Prompt(list(item), None))
    return out


def check_token_ids(model: LLMModel, ids: list[int], what: str, param: str) -> None:
    vocab = model.tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise SluiceError(f"{what}: token id {bad} is outside the vocabulary [0, {vocab})", ErrorKind.INVALID_ARG,
                          param=param)
