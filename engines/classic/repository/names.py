"""Model names are plain names: they become directory names, so nothing in them may reach outside one."""

from __future__ import annotations

import re

from engines.classic.errors import invalid

# A letter, digit or underscore, then up to 127 of those, '.' or '-'; never '..'.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_model_name(name: str) -> str:
    """Return `name`, or raise InferError(INVALID_ARG) for anything but a plain model name."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        shown = repr(name)[:80]
        raise invalid(f"invalid model name {shown}: a model name is 1 to 128 letters, digits, '_', '.' or '-', "
                      "starting with a letter, digit or '_', without '..'")
    return name
