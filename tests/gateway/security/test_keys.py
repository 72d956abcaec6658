"""Keys from the environment and from files: digests only, ids for display, errors that never quote a key."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gateway.security.keys import KeyRing, Limits, from_csv, from_file


def test_csv_keys_match_and_ids_are_digest_prefixes() -> None:
    ring = KeyRing(from_csv(" sk-one-aaaaaaaa , ,sk-two-bbbbbbbb", "SLUICE_API_KEYS"))
    assert len(ring) == 2
    one = ring.match("sk-one-aaaaaaaa")
    assert one is not None and one.id == "key-" + hashlib.sha256(b"sk-one-aaaaaaaa").hexdigest()[:12]
    assert ring.match("sk-two-bbbbbbbb") is not None
    assert ring.match("sk-one-aaaaaaa") is None and ring.match("") is None and ring.match(None) is None
    assert "sk-one" not in repr(ring) and "sk-one" not in repr(ring.principals())


def test_only_digests_are_kept() -> None:
    ring = KeyRing(from_csv("sk-plain-text-key", "env"))
    assert [d for d, _ in ring._entries] == [hashlib.sha256(b"sk-plain-text-key").digest()]
    assert "sk-plain-text-key" not in repr(ring._entries)


def test_yaml_file_with_ids_limits_and_sha256(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"sk-hashed-only").hexdigest()
    path = tmp_path / "keys.yaml"
    path.write_text(f"- {{id: team-a, key: sk-team-a, rpm: 5, concurrency: 2}}\n"
                    f"- {{id: team-b, sha256: {digest}}}\n- sk-bare-in-list\n")
    ring = KeyRing(from_file(path), Limits(rpm=100, tpm=1000))
    a, b, bare = ring.match("sk-team-a"), ring.match("sk-hashed-only"), ring.match("sk-bare-in-list")
    assert a is not None and a.id == "team-a" and a.limits == Limits(rpm=5, tpm=1000, concurrency=2)
    assert b is not None and b.id == "team-b" and b.limits == Limits(rpm=100, tpm=1000)
    assert bare is not None and bare.id.startswith("key-")


def test_plain_file_one_key_per_line(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text("# operators' keys\nsk-line-one\n\nsk-line-two\n")
    ring = KeyRing(from_file(path))
    assert len(ring) == 2 and ring.match("sk-line-two") is not None


@pytest.mark.parametrize("text", [
    "- {id: a, key: sk-secret-value, rpm: -1}\n",
    "- {id: a, key: sk-secret-value, rpm: many}\n",
    "- {id: 'bad id', key: sk-secret-value}\n",
    "- {id: a, key: sk-secret-value, sha256: abc}\n",
    "- {id: a, key: sk-secret-value, colour: red}\n",
    "- {id: a, key: sk-secret-value}\n- {id: a, key: sk-secret-value-2}\n",
    "- {id: a, key: sk-secret-value}\n- {id: b, key: sk-secret-value}\n",
    "sk-secret-value with spaces\n",
])
def test_bad_files_are_refused_without_quoting_keys(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        KeyRing(from_file(path))
    assert "sk-secret" not in str(e.value)


def test_scopes_default_to_all_and_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "admin.yaml"
    path.write_text("- {id: a, key: sk-a}\n- {id: b, key: sk-b, scopes: [workers, metrics]}\n")
    ring = KeyRing(from_file(path))
    a, b = ring.match("sk-a"), ring.match("sk-b")
    assert a is not None and a.scopes == {"repository", "workers", "metrics"}
    assert b is not None and b.scopes == {"workers", "metrics"}
    for bad in ("[]", "[admin]", "workers", "[workers, 1]"):
        path.write_text(f"- {{id: c, key: sk-secret-c, scopes: {bad}}}\n")
        with pytest.raises(ValueError, match="'scopes' must be a non-empty list") as e:
            from_file(path)
        assert "sk-secret-c" not in str(e.value)
