"""Replaying the Mooncake FAST'25 synthetic trace (/work/shared/traces, see its README).

Each line is one request: `timestamp` (ms), `input_length`, `output_length` and
`hash_ids`, the prompt's 512-token blocks (equal ids: a reusable block). A hash id
becomes a fixed run of 512 token ids (the same id always gives the same tokens), the
prompt is the concatenation of its ids' runs cut to `input_length`, and the sim and
the router then hash it at their own block size (128 here), as they would any
prompt. `time_scale` stretches the arrival times (2.0: half the trace's rate).
Every request is its own open-loop session, keyed by its first hash id (a
conversation's turns and a document's questions share it) for the `session` policy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadtests.routing.vtime.sessions import Session, Turn
from loadtests.routing.vtime.workloads import VOCAB

TRACE = Path("/work/shared/traces/mooncake_synthetic_trace.jsonl")
TRACE_BLOCK = 512


def load(path: Path = TRACE) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class _Blocks:
    """512 token ids per hash id, drawn once (numpy, seeded by the id)."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._runs: dict[int, np.ndarray] = {}

    def prompt(self, hash_ids: Sequence[int], length: int) -> list[int]:
        runs = []
        for h in hash_ids:
            run = self._runs.get(h)
            if run is None:
                rng = np.random.default_rng([self._seed, h])
                run = self._runs[h] = rng.integers(1, VOCAB, TRACE_BLOCK, dtype=np.int32)
            runs.append(run)
        out: list[int] = np.concatenate(runs)[:length].tolist()
        return out


def sessions(rows: Sequence[dict[str, object]], *, time_scale: float = 1.0, max_model_len: int = 1 << 30,
             seed: int = 0, limit: int | None = None) -> list[Session]:
    blocks = _Blocks(seed)
    out = []
    for i, row in enumerate(rows[:limit]):
        hash_ids = [int(h) for h in row["hash_ids"]]  # type: ignore[attr-defined]
        n_in = min(int(row["input_length"]), max_model_len - 2)  # type: ignore[call-overload]
        n_out = max(1, min(int(row["output_length"]), max_model_len - n_in - 1))  # type: ignore[call-overload]
        start = float(row["timestamp"]) / 1000.0 * time_scale  # type: ignore[arg-type]
        out.append(Session(f"mc{i}", start, _one(blocks, hash_ids, n_in, n_out, str(hash_ids[0])),
                           f"mc{hash_ids[0]}"))
    return out


def _one(blocks: _Blocks, hash_ids: list[int], n_in: int, n_out: int, group: str):  # type: ignore[no-untyped-def]
    done = [False]

    def next_turn(_previous: Sequence[int] | None) -> Turn | None:
        if done[0]:
            return None
        done[0] = True
        return Turn(blocks.prompt(hash_ids, n_in), n_out, 0.0, group)
    return next_turn
