"""Sim profiles: a cost model plus the engine shape it was measured with.

A profile is named by `--profile`:

- ``zero``: no delay at all (every step takes 0 s), for measuring the gateway itself;
- a name in ``engines/sim/profiles/`` (``vllm-cpu-tiny-llama``), or a path to such a file;
- numbers: ``'base_s=0.004,prefill_token_s=2e-5,decode_seq_s=1e-4'`` (missing ones are 0).

The file format (``format: sluice-sim-profile/1``)::

    {"format": "sluice-sim-profile/1", "name": "...", "description": "...",
     "cost": {"base_s": ..., "prefill_token_s": ..., "prefill_attn_s": ..., "decode_seq_s": ...},
     "engine": {"block_size": 128, "num_gpu_blocks": 2048, "max_num_seqs": 128,
                "max_num_batched_tokens": 2048},
     "fit": {...how it was fitted: engine, model, residuals, report path...}}

`engine` keys are defaults that flags override; `fit` is provenance, not read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engines.sim.model.config import COST_FIELDS, CostModel

FORMAT = "sluice-sim-profile/1"
PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
ENGINE_KEYS = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
ProfileSource = Literal["zero", "file", "numbers"]


@dataclass(frozen=True, slots=True)
class Profile:
    name: str  # shown in /metrics (sluice_sim_info) and the model card
    source: ProfileSource
    cost: CostModel
    engine: dict[str, int] = field(default_factory=dict)  # defaults for the engine shape
    description: str = ""

    def to_json(self, fit: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "name": self.name, "description": self.description,
                               "cost": {f: getattr(self.cost, f) for f in COST_FIELDS},
                               "engine": dict(self.engine)}
        if fit is not None:
            out["fit"] = fit
        return out


ZERO = Profile("zero", "zero", CostModel(), description="no delay: every step takes 0 s")


def available() -> list[str]:
    """Profile names shipped in engines/sim/profiles/, plus `zero`."""
    return ["zero", *sorted(p.stem for p in PROFILES_DIR.glob("*.json"))]


def load_profile(spec: str) -> Profile:
    """`zero`, a shipped name, a JSON path, or `name=value,...` numbers; ValueError otherwise."""
    spec = spec.strip()
    if spec == "zero":
        return ZERO
    if "=" in spec:
        return _from_numbers(spec)
    path = Path(spec)
    if not path.suffix and not path.exists():
        path = PROFILES_DIR / f"{spec}.json"
    if not path.is_file():
        raise ValueError(f"unknown sim profile {spec!r}: give zero, one of {', '.join(available())}, "
                         "a JSON file, or numbers like 'base_s=0.004,prefill_token_s=2e-5,decode_seq_s=1e-4'")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"sim profile {path}: {e}") from None
    return profile_from_json(data, where=str(path))


def profile_from_json(data: Any, where: str = "profile") -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{where}: not a {FORMAT} document")
    cost = data.get("cost")
    engine = data.get("engine") or {}
    if not isinstance(cost, dict) or not isinstance(engine, dict):
        raise ValueError(f"{where}: `cost` and `engine` must be objects")
    unknown = (set(cost) - set(COST_FIELDS)) | (set(engine) - set(ENGINE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    for key, value in engine.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{where}: engine.{key} must be an integer >= 1")
    return Profile(str(data.get("name") or Path(where).stem), "file", CostModel(**cost), dict(engine),
                   str(data.get("description") or ""))


def _from_numbers(spec: str) -> Profile:
    values: dict[str, float] = {}
    for item in spec.split(","):
        key, sep, number = item.partition("=")
        key = key.strip()
        if not sep or key not in COST_FIELDS:
            raise ValueError(f"sim profile numbers: expected NAME=SECONDS with NAME one of {', '.join(COST_FIELDS)}, "
                             f"got {item.strip()!r}")
        try:
            value = float(number)
        except ValueError:
            raise ValueError(f"sim profile numbers: {key} must be a number, got {number.strip()!r}") from None
        if not math.isfinite(value):
            raise ValueError(f"sim profile numbers: {key} must be finite")
        values[key] = value
    cost = CostModel(**values)
    label = ",".join(f"{k}={values[k]:g}" for k in COST_FIELDS if k in values)
    return Profile(f"numbers:{label}", "numbers", cost, description="given as numbers on the command line")
