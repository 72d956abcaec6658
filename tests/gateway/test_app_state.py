"""Routing hints from a request's headers (`gateway.app_state`)."""

from __future__ import annotations

import hashlib

from gateway.app_state import session_key_of
from gateway.settings import Settings

NAMES = ("x-session-id", *Settings().session_headers)


def test_the_routers_header_first_then_the_agents_known_ones() -> None:
    assert session_key_of({"x-session-id": "a", "x-claude-code-session-id": "b"}, NAMES) == "a"
    assert session_key_of({"x-claude-code-session-id": "b", "conversation_id": "c"}, NAMES) == "b"
    assert session_key_of({"session_id": "codex-1"}, NAMES) == "codex-1"
    assert session_key_of({"x-other": "z"}, NAMES) is None and session_key_of({"x-session-id": ""}, NAMES) is None


def test_a_huge_session_value_is_bounded() -> None:
    huge = "s" * 50_000
    assert session_key_of({"x-session-id": huge}, NAMES) == hashlib.sha256(huge.encode()).hexdigest()
