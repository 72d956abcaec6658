"""OpenAI prompts to token ids: chat messages through the model's own template (`render_chat`,
shared by chat and `/tokenize`, so both give exactly the ids the engine is sent), and the four
completion prompt forms."""

from __future__ import annotations

from functools import partial
from typing import Any

from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import Renderer
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


# apply_chat_template's own arguments: a client's template kwargs must not override them.
_RESERVED_KWARGS = frozenset({"tokenize", "tools", "documents", "add_generation_prompt", "continue_final_message",
                              "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding",
                              "truncation", "max_length", "tokenizer_kwargs", "conversation"})


async def render_chat(renderer: Renderer, model: LLMModel, messages: list[ChatMessage], body: ChatTemplateFields
                      ) -> list[int]:
    """Token ids of the conversation as the engine will see them; chat and /tokenize both call this.

    Client-supplied templates (`chat_template`, or `chat_template_kwargs.chat_template`) are refused
    unless the operator opts in. The render runs off the event loop, within the renderer's limits."""
    kwargs = dict(body.chat_template_kwargs or {})
    if (body.chat_template or kwargs.get("chat_template")) is not None and not renderer.allow_client_templates:
        raise SluiceError("client-supplied chat templates are not allowed on this server "
                          "(the operator can allow them with --allow-client-chat-templates)",
                          ErrorKind.INVALID_ARG, param="chat_template")
    reserved = sorted(set(kwargs) & _RESERVED_KWARGS)
    if reserved:
        raise SluiceError(f"chat_template_kwargs may not set {', '.join(reserved)}", ErrorKind.INVALID_ARG,
                          param="chat_template_kwargs")
    if body.chat_template is not None:
        kwargs["chat_template"] = body.chat_template
    flat = template_messages(messages)
    chars = sum(len(m["content"]) for m in flat)
    if chars > renderer.max_prompt_chars:
        raise SluiceError(f"the messages have {chars} characters; this server accepts at most "
                          f"{renderer.max_prompt_chars}", ErrorKind.INVALID_ARG, param="messages")
    return await renderer.run(partial(_render, model, flat, body, kwargs))


def _render(model: LLMModel, messages: list[dict[str, Any]], body: ChatTemplateFields, kwargs: dict[str, Any]
            ) -> list[int]:
    try:
        return model.tokenizer.render_chat(messages, tools=body.tools, add_generation_prompt=body.add_generation_prompt,
                                           continue_final_message=body.continue_final_message, template_kwargs=kwargs)
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


def prompt_size(prompt: Any) -> tuple[int, int]:
    """(characters of text, characters and token ids) of a completion prompt: what tokenizing it costs."""
    items = _prompt_items(prompt)
    chars = sum(len(item) for item in items if isinstance(item, str))
    return chars, sum(len(item) for item in items)


async def tokenize_prompts(pool: Renderer, model: LLMModel, prompt: Any) -> list[Prompt]:
    """`completion_prompts`, off the event loop unless small, within the pool's size bound."""
    chars, work = prompt_size(prompt)
    return await pool.tokenize(partial(completion_prompts, model, prompt), chars, "prompt", work=work)


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
