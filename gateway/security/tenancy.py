"""Tenants' prefix-cache namespaces: the `cache_salt` every engine request carries.

A tenant is an API key (named by its public id) unless the keys file groups several
keys under one `tenant:`. Each tenant's requests carry a salt derived here, server-side,
from the tenant's name: vLLM mixes it into the first KV block's hash (so one tenant's
cached prefix never serves another's prompt) and the router salts its own block hashes
with it (so `X-Sluice-Predicted-Cached-Tokens` counts only the caller's namespace).

A client may still send `cache_salt` (vLLM's extra) to split its own traffic further: it
is hashed together with the tenant, so it picks a namespace *within* the tenant's and can
never name another tenant's. Without API keys the gateway is open and has one tenant: no
salt, unless the client sends one.

The salt is a hash of public names, not a secret: what keeps it out of clients' hands is
that they cannot choose it (above) and cannot reach a worker without the worker key. Every
gateway replica derives the same salt for a tenant, so replicas share the worker caches
and each other's KV-event indexes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import msgpack

from gateway.security.keys import Principal

_TAG = "sluice-cache-namespace-v1"


class CacheNamespaces:
    """Key id -> tenant, and the salt an engine request of that key carries."""

    def __init__(self, tenants: Mapping[str, str]) -> None:
        self._tenants = dict(tenants)  # empty: an open gateway (one tenant)

    @classmethod
    def of(cls, principals: Iterable[Principal]) -> CacheNamespaces:
        return cls({p.id: p.tenant or p.id for p in principals})

    @property
    def isolated(self) -> bool:
        """Whether requests are salted per tenant (API keys are configured)."""
        return bool(self._tenants)

    def tenant(self, key_id: str | None) -> str | None:
        return self._tenants.get(key_id) if key_id is not None else None

    def salt(self, key_id: str | None, client_salt: str | None = None) -> str | None:
        """The salt for a request of `key_id` whose client sent `client_salt`; None: no salt.

        With keys configured every request is salted: a key id the table does not know (the
        edges never pass one) gets a namespace apart from every tenant's and the unsalted one."""
        if not self._tenants and client_salt is None:
            return None
        payload = msgpack.packb([_TAG, self.tenant(key_id), client_salt], use_bin_type=True)
        return hashlib.sha256(payload).hexdigest()[:32]  # 128 bits; vLLM takes at most 128 characters
