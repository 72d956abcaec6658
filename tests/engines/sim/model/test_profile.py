"""Sim profiles: zero, shipped files, JSON paths and numbers on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.sim.model.config import CostModel
from engines.sim.model.profile import FORMAT, ZERO, available, load_profile


def test_zero_has_no_delay() -> None:
    assert load_profile("zero") is ZERO and ZERO.cost.zero and ZERO.source == "zero"


def test_numbers_are_labelled_as_such() -> None:
    p = load_profile("base_s=0.004, prefill_token_s=2e-5,decode_seq_s=1e-4")
    assert p.cost == CostModel(base_s=0.004, prefill_token_s=2e-5, decode_seq_s=1e-4)
    assert (p.source, p.name) == ("numbers", "numbers:base_s=0.004,prefill_token_s=2e-05,decode_seq_s=0.0001")


@pytest.mark.parametrize(("spec", "message"), [
    ("base_s=abc", "must be a number"), ("speed=1", "expected NAME=SECONDS"), ("base_s=-1", "must be a number"),
    ("base_s=inf", "finite"), ("no-such-profile", "unknown sim profile")])
def test_bad_profiles_are_refused_with_a_reason(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_profile(spec)


def test_every_shipped_profile_loads() -> None:
    names = available()
    assert "zero" in names and "vllm-cpu-tiny-llama" in names
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        if name != "zero":
            assert profile.source == "file" and profile.engine["block_size"] == 128 and not profile.cost.zero


def test_a_profile_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    cost = {"base_s": 0.001, "prefill_token_s": 1e-5, "prefill_attn_s": 0.0, "decode_seq_s": 2e-4,
            "request_latency_s": 0.01}
    path.write_text(json.dumps({"format": FORMAT, "name": "mine", "cost": cost, "engine": {"num_gpu_blocks": 64}}))
    p = load_profile(str(path))
    assert (p.name, p.cost, p.engine) == ("mine", CostModel(**cost), {"num_gpu_blocks": 64})
    assert load_profile(str(path)).to_json()["cost"] == cost


def test_a_profile_file_with_unknown_keys_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "typo.json"
    path.write_text(json.dumps({"format": FORMAT, "cost": {"base": 1}}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_profile(str(path))
