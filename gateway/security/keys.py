"""API and admin keys: loaded from the environment or a file, kept only as SHA-256 digests.

A key's public id (from the keys file, else `key-` and the first 12 hex digits of
its digest) is the only thing about it that metrics, logs and errors may show.
Nothing in this module formats a key value into a message: a malformed file is
reported by path, entry number and field, never by content.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.llm.admission.policy import (
    DEFAULT_ENTITLEMENT,
    DEFAULT_PRIORITY,
    MAX_DEADLINE_MS,
    MAX_WEIGHT,
    PRIORITIES,
    Entitlement,
)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_LIMITS = ("rpm", "tpm", "concurrency")
_SCHEDULING = ("weight", "priority", "max_priority", "ttft_deadline_ms")
_FIELDS = {"id", "key", "sha256", "scopes", "tenant", *_LIMITS, *_SCHEDULING}
SCOPES = ("repository", "workers", "metrics")  # an admin key's; gateway.security.access names their routes
ALL_SCOPES = frozenset(SCOPES)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-key quotas; 0 means unlimited."""

    rpm: int = 0  # requests per minute
    tpm: int = 0  # prompt + completion tokens per minute
    concurrency: int = 0  # requests in flight at once

    @property
    def unlimited(self) -> bool:
        return not (self.rpm or self.tpm or self.concurrency)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request runs as: a key's public id and its limits. Never holds the key."""

    id: str
    limits: Limits = Limits()
    scopes: frozenset[str] = ALL_SCOPES  # what an admin key opens (API keys: unused)
    # An API key's prefix-cache namespace (gateway.security.tenancy): its keys-file `tenant`, else its id.
    tenant: str | None = None
    entitlement: Entitlement = DEFAULT_ENTITLEMENT


@dataclass(frozen=True, slots=True)
class KeyEntry:
    digest: bytes  # SHA-256 of the key
    id: str | None = None  # the operator's name for it; None: derived from the digest
    overrides: dict[str, int] | None = None  # per-key limits over the server-wide defaults
    scopes: frozenset[str] = ALL_SCOPES  # an admin key's scopes (a keys file's `scopes`); default all
    tenant: str | None = None  # keys sharing a tenant share a prefix-cache namespace; None: its own
    entitlement: Entitlement = DEFAULT_ENTITLEMENT

    def public_id(self) -> str:
        return self.id or "key-" + self.digest.hex()[:12]


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class KeyRing:
    """Digests of the accepted keys. `match` compares the presented key's digest with
    every stored digest in constant time and never stops at the first match, so the
    time taken says nothing about which key (if any) matched."""

    def __init__(self, entries: Iterable[KeyEntry], defaults: Limits = Limits()) -> None:
        self._entries: list[tuple[bytes, Principal]] = []
        seen_ids: set[str] = set()
        seen_digests: set[bytes] = set()
        weights: dict[str, float] = {}
        for e in entries:
            pid = e.public_id()
            if pid in seen_ids:
                raise ValueError(f"two keys share the id {pid!r}")
            if e.digest in seen_digests:
                raise ValueError(f"the key with id {pid!r} is listed twice")
            seen_ids.add(pid)
            seen_digests.add(e.digest)
            tenant = e.tenant or pid
            if weights.setdefault(tenant, e.entitlement.weight) != e.entitlement.weight:
                raise ValueError(f"the keys of tenant {tenant!r} give it different weights")
            limits = Limits(**{**_as_dict(defaults), **(e.overrides or {})})
            self._entries.append((e.digest, Principal(pid, limits, e.scopes, tenant, e.entitlement)))

    def match(self, key: str | None) -> Principal | None:
        if not key:
            return None
        presented = digest(key)
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, presented) and found is None:
                found = principal
        return found

    def principals(self) -> list[Principal]:
        return [p for _, p in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"KeyRing({len(self._entries)} keys)"


def _as_dict(limits: Limits) -> dict[str, int]:
    return {name: getattr(limits, name) for name in _LIMITS}


def from_csv(value: str | None, origin: str) -> list[KeyEntry]:
    """Comma-separated keys (an environment variable); blanks are ignored."""
    out = []
    for i, raw in enumerate((value or "").split(",")):
        key = raw.strip()
        if key:
            out.append(KeyEntry(digest(_check_key(key, f"{origin} item {i + 1}"))))
    return out


def single(value: str | None) -> list[KeyEntry]:
    """One key taken whole (SLUICE_ADMIN_KEY, which predates the comma-separated lists)."""
    key = (value or "").strip()
    return [KeyEntry(digest(key))] if key else []


def from_file(path: Path) -> list[KeyEntry]:
    """A YAML list of `{id, key | sha256, rpm, tpm, concurrency, scopes, tenant, weight, priority,
    max_priority, ttft_deadline_ms}` (or `{keys: [...]}`),
    or a plain file with one key per line (`#` starts a comment line)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read keys file {path}: {e.strerror}") from None
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None  # a plain key may not be valid YAML; the plain format below decides
    if isinstance(data, dict) and isinstance(data.get("keys"), list):
        data = data["keys"]
    if not isinstance(data, list):
        return [KeyEntry(digest(_check_key(line.strip(), f"{path} line {n}")))
                for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")]
    return [_entry(item, f"{path} entry {n}") for n, item in enumerate(data, 1)]


def _entry(item: Any, where: str) -> KeyEntry:
    if isinstance(item, str):
        return KeyEntry(digest(_check_key(item, where)))
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a key or a mapping with 'key'")
    unknown = set(item) - _FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    key_id = item.get("id")
    if key_id is not None and not (isinstance(key_id, str) and _ID.match(key_id)):
        raise ValueError(f"{where}: 'id' must be 1-64 letters, digits or ._:- (it becomes a metric label)")
    tenant = item.get("tenant")
    if tenant is not None and not (isinstance(tenant, str) and _ID.match(tenant)):
        raise ValueError(f"{where}: 'tenant' must be 1-64 letters, digits or ._:-")
    scopes = _scopes(item.get("scopes", list(SCOPES)), where)
    overrides = {}
    for name in _LIMITS:
        if item.get(name) is not None:
            value = item[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{where}: '{name}' must be an integer >= 0 (0: unlimited)")
            overrides[name] = value
    if ("key" in item) == ("sha256" in item):
        raise ValueError(f"{where}: give exactly one of 'key' and 'sha256'")
    if "sha256" in item:
        hexdigest = item["sha256"]
        if not (isinstance(hexdigest, str) and re.fullmatch(r"[0-9a-fA-F]{64}", hexdigest)):
            raise ValueError(f"{where}: 'sha256' must be 64 hex digits")
        raw = bytes.fromhex(hexdigest)
    else:
        raw = digest(_check_key(item["key"], where))
    return KeyEntry(raw, key_id, overrides or None, scopes, tenant, _entitlement(item, where))


def _entitlement(item: dict[str, Any], where: str) -> Entitlement:
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_WEIGHT:
        raise ValueError(f"{where}: 'weight' must be a number in (0, {MAX_WEIGHT:g}]")
    priority = item.get("priority", DEFAULT_PRIORITY)
    most = item.get("max_priority", priority)
    for name, value in (("priority", priority), ("max_priority", most)):
        if value not in PRIORITIES:
            raise ValueError(f"{where}: '{name}' must be one of {', '.join(PRIORITIES)}")
    if PRIORITIES.index(most) > PRIORITIES.index(priority):
        raise ValueError(f"{where}: 'max_priority' may not be less urgent than 'priority'")
    deadline = item.get("ttft_deadline_ms")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int)
                                 or not 1 <= deadline <= MAX_DEADLINE_MS):
        raise ValueError(f"{where}: 'ttft_deadline_ms' must be an integer in [1, {MAX_DEADLINE_MS}]")
    return Entitlement(float(weight), priority, most, deadline)


def _scopes(value: Any, where: str) -> frozenset[str]:
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v in SCOPES for v in value)):
        raise ValueError(f"{where}: 'scopes' must be a non-empty list of {', '.join(SCOPES)}")
    return frozenset(value)


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key or any(c.isspace() or c == "," for c in key):
        raise ValueError(f"{where}: a key must be a non-empty string without spaces or commas")
    return key
