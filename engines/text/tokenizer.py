"""The model's own tokenizer and chat template, as the gateway needs them.

The gateway renders chat templates itself so that it knows the exact token ids
the engine will see (for routing and context checks). transformers is imported
lazily so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines.text.chat_cache import ChatRenderCache, prefix_keys


def _safe_cut_ids(backend: Any) -> set[int]:
    """Special tokens before which a text may be cut and tokenized in two halves with the same
    result: those that strip no whitespace on their left, checked on a probe text."""
    safe = set()
    for token_id, added in backend.get_added_tokens_decoder().items():
        if not added.special or added.lstrip:
            continue
        probe_left, probe_right = "a b\n", f"{added.content}x y"
        whole = backend.encode(probe_left + probe_right, add_special_tokens=False).ids
        parts = (backend.encode(probe_left, add_special_tokens=False).ids
                 + backend.encode(probe_right, add_special_tokens=False).ids)
        if whole == parts:
            safe.add(int(token_id))
    return safe


class ChatTokenizer:
    """Thread-safe for reads; tokenizers' Rust core releases the GIL."""

    def __init__(self, model_dir: Path | str, tokenizer: Any = None) -> None:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_token_id = tokenizer.eos_token_id
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # Incremental chat tokenization needs the fast tokenizer's offsets; a slow one renders in full.
        self._chats = ChatRenderCache(self._encode_offsets, _safe_cut_ids(backend)) if backend else None

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of the rendered conversation, exactly as the engine will see them."""
        if not self.has_chat_template:
            raise ValueError("this model has no chat template; use /v1/completions")
        text = self._tok.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            **(template_kwargs or {}),
        )
        # The template already contains the special tokens; do not add BOS twice.
        if self._chats is None:
            return list(self._tok.encode(str(text), add_special_tokens=False))
        context = [tools, add_generation_prompt, continue_final_message, template_kwargs]
        return self._chats.tokenize(str(text), prefix_keys(messages, context))

    def _encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        # encode_batch, not encode: the tokenizers binding releases the GIL only in the batch call,
        # so a long prompt tokenized on the render thread no longer stops the event loop for its
        # milliseconds (2 µs a token here); the ids and offsets are the same.
        enc = self._tok.backend_tokenizer.encode_batch([text], add_special_tokens=False)[0]
        return list(enc.ids), [start for start, _ in enc.offsets]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))
