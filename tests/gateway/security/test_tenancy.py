"""Tenants' prefix-cache namespaces: grouped keys share one, a client's salt stays within its tenant's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest

from gateway.security.keys import KeyRing, from_file
from gateway.security.tenancy import CacheNamespaces


def _ring(tmp_path: Path) -> KeyRing:
    path = tmp_path / "keys.yaml"
    path.write_text("- {id: a1, key: sk-a1-secret, tenant: team-a}\n- {id: b, key: sk-b-secret}\n"
                    "- {id: a2, key: sk-a2-secret, tenant: team-a}\n- sk-bare-secret\n")
    return KeyRing(from_file(path))


def test_keys_file_groups_keys_into_tenants(tmp_path: Path) -> None:
    ring = _ring(tmp_path)
    tenants = {p.id: p.tenant for p in ring.principals()}
    bare = next(p.id for p in ring.principals() if p.id.startswith("key-"))
    assert tenants == {"a1": "team-a", "b": "b", "a2": "team-a", bare: bare}


def test_each_tenant_gets_its_own_salt_and_groupmates_share_it(tmp_path: Path) -> None:
    ns = CacheNamespaces.of(_ring(tmp_path).principals())
    assert ns.isolated
    a1, a2, b = ns.salt("a1"), ns.salt("a2"), ns.salt("b")
    assert a1 is not None and b is not None
    assert a1 == a2 != b
    # vLLM's own rule for cache_salt: at most 128 characters, none of @ / \ NUL.
    assert len(a1) <= 128 and not set(a1) & set("@/\\\x00")
    assert ns.salt(None) not in (a1, b, None)  # no key: a namespace apart, never the unsalted one


def test_a_client_salt_splits_within_its_tenant_and_cannot_reach_another(tmp_path: Path) -> None:
    ns = CacheNamespaces.of(_ring(tmp_path).principals())
    b_salt = ns.salt("b")
    assert ns.salt("a1", "x") == ns.salt("a2", "x") != ns.salt("a1")
    # Tenant a sending b's derived salt, or b's tenant name, still lands in a's namespace.
    assert ns.salt("a1", b_salt) != b_salt and ns.salt("a1", "b") != b_salt
    tag = msgpack.packb(["sluice-cache-namespace-v1", "b", None], use_bin_type=True)
    assert b_salt == hashlib.sha256(tag).hexdigest()[:32]  # stable across replicas and restarts


def test_an_open_gateway_is_one_tenant() -> None:
    ns = CacheNamespaces({})
    assert not ns.isolated
    assert ns.salt("anonymous") is None and ns.salt(None) is None
    assert ns.salt("anonymous", "x") == ns.salt(None, "x") is not None


@pytest.mark.parametrize("tenant", ["'bad tenant'", "''", "[a]", "7"])
def test_bad_tenant_names_are_refused(tmp_path: Path, tenant: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"- {{id: a, key: sk-secret-value, tenant: {tenant}}}\n")
    with pytest.raises(ValueError, match="'tenant'") as e:
        KeyRing(from_file(path))
    assert "sk-secret" not in str(e.value)
