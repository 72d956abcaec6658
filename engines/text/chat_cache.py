"""Incremental chat tokenization: a new turn tokenizes only what is new.

Rendering and tokenizing a whole conversation at every turn costs time that grows
with its length. `ChatRenderCache` keeps, per rendered conversation, its text and
token ids, keyed by a hash chained over the message list (and everything else the
template sees). A later request whose messages extend a cached conversation reuses
that conversation's ids up to a *cut*, and tokenizes only the text after it.

A cut is safe only where tokenizing the two halves apart gives the same ids as
tokenizing the whole: just before a special token (tokenizers split added special
tokens out of the text before any normalisation or BPE merge), at a position where
the new render's text equals the cached text (checked, never assumed). So the
result is identical to a full render's, by construction.

Thread-safe: renders may run on worker threads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# (ids, char offset where each token starts) of a text
Encoder = Callable[[str], tuple[list[int], list[int]]]


@dataclass(frozen=True, slots=True)
class _Entry:
    text: str
    ids: np.ndarray  # uint32: a conversation of 32k tokens costs 128 KiB
    cuts: np.ndarray  # int64 pairs (char offset, token index) just before each special token


def prefix_keys(messages: Sequence[dict[str, Any]], context: Any) -> list[str]:
    """keys[k] identifies messages[:k+1] under `context` (tools, template flags): one pass, O(total size)."""
    h = hashlib.blake2b(json.dumps(context, sort_keys=True, default=str).encode(), digest_size=16).digest()
    keys = []
    for m in messages:
        h = hashlib.blake2b(h + json.dumps(m, sort_keys=True, default=str).encode(), digest_size=16).digest()
        keys.append(h.hex())
    return keys


class ChatRenderCache:
    """LRU over conversations, bounded by the tokens it holds (`max_tokens`)."""

    def __init__(self, encode: Encoder, special_ids: set[int], max_tokens: int = 4_000_000) -> None:
        self._encode = encode
        self._special = np.fromiter(special_ids, dtype=np.uint32)
        self._max_tokens = max_tokens
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0  # renders that reused a cached conversation
        self.reused_tokens = 0

    def tokenize(self, text: str, keys: list[str]) -> list[int]:
        """The ids of `text` (the render of the conversation whose prefix keys are `keys`)."""
        base = self._longest_cached(keys[:-1])
        ids, cuts = self._tokenize_after(text, base)
        if keys:
            self._store(keys[-1], _Entry(text, ids, cuts))
        return ids.tolist()  # type: ignore[no-any-return]

    def _longest_cached(self, keys: list[str]) -> _Entry | None:
        with self._lock:
            for key in reversed(keys):
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    return entry
        return None

    def _tokenize_after(self, text: str, base: _Entry | None) -> tuple[np.ndarray, np.ndarray]:
        char_cut, token_cut = self._cut(text, base)
        ids, starts = self._encode(text[char_cut:])
        new_ids = np.asarray(ids, dtype=np.uint32)
        special = np.isin(new_ids, self._special)
        new_cuts = np.stack([np.asarray(starts, dtype=np.int64)[special] + char_cut,
                             np.flatnonzero(special).astype(np.int64) + token_cut], axis=1)
        if base is None or token_cut == 0:
            return new_ids, new_cuts.reshape(-1, 2)
        self.hits += 1
        self.reused_tokens += token_cut
        old_cuts = base.cuts[base.cuts[:, 1] < token_cut]
        return (np.concatenate([base.ids[:token_cut], new_ids]),
                np.concatenate([old_cuts, new_cuts.reshape(-1, 2)]))

    @staticmethod
    def _cut(text: str, base: _Entry | None) -> tuple[int, int]:
        """The last safe cut of `base` at which `text` agrees with it, as (chars, tokens)."""
        if base is None:
            return 0, 0
        for char_pos, token_pos in base.cuts[::-1]:
            if char_pos <= len(text) and text.startswith(base.text[:char_pos]):
                return int(char_pos), int(token_pos)
        return 0, 0

    def _store(self, key: str, entry: _Entry) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            self._tokens -= len(old.ids) if old is not None else 0
            self._entries[key] = entry
            self._tokens += len(entry.ids)
            while self._tokens > self._max_tokens and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                self._tokens -= len(evicted.ids)
