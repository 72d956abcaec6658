"""Learning the cost's coefficients online, from what each worker actually did. Pure: no I/O, no clock.

Two kinds of observation, both of which the router already sees:

- **TTFT** (`observe_ttft`): for every request, the features it was dispatched
  with (`router.cost.TtftFeatures`: requests running, prefill tokens and pairs
  queued ahead plus its own) and the time from its dispatch to its first token.
  They fit the worker's `TtftModel` (latency_s, running_s, token_s, pair_s) by
  least squares on *relative* errors (each observation weighs 1/ttft²), so a
  20 ms TTFT counts as much as a 20 s one; the coefficients cannot go negative.
- **Evictions and refills** (`evicted`, `stored`): of the blocks a worker's KV
  events remove, the fraction that is stored again later is the worker's
  `refill_ratio`, the chance that an evicted block was still needed.
- **Answer lengths** (`observe_answer`): the tokens each finished request generated, per
  model; their recent mean (`answer_tokens`) prices how long a new request will share a
  worker's decode batch (`router.cost.decode_s`).

The fleet has one fit of the four coefficients, over every worker's observations;
`LearningConfig.prior` is its prior until anything was observed. A worker's model is the
fleet's times one learned **speed factor** (1 for a worker like the fleet's average, 2 for
one twice as slow), fitted to the worker's own observations on relative errors with a prior
of 1 that weighs as `worker_prior_weight` observations. One scalar per worker, not four
coefficients: the router takes the cheapest of many workers' predictions, and four loosely
identified coefficients per worker (`pair_s` is seen only on the rare long prompt) make that
minimum land on whichever worker's fit happens to be most optimistic. In virtual time at 64
identical workers that put 3.8 times the mean work on one worker (`loadtests/routing/bench_vtime.py`).
A fleet of unlike machines is still learned, as a speed per worker.

The frontends of `--frontends N` learn as one (`set_remote`): each adds the other processes'
statistics (`export`: the fleet fit's sums, the speed factors' sums, the answer-length means) to
its own, so each solves the same problem over every process's observations.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from router.config import LearningConfig, TtftModel
from router.cost import TtftFeatures
from router.fit import LinearFit

_FLEET_PRIOR_WEIGHT = 1.0  # the configured prior counts as one observation in the fleet's fit
_MIN_TTFT_S = 1e-3  # relative weights of TTFTs below this are capped (a clock's resolution)
_MAX_ANSWER_TOKENS = 1 << 20  # an engine's count beyond any context window is clamped
_MAX_MODELS = 4096  # answer-length means kept, one per served model name


@dataclass(slots=True)
class _Worker:
    # The speed factor's statistics, kept so that it is always computed against the fleet's
    # current coefficients θ: with r = θ·x / y (the fleet's prediction over the actual TTFT) per
    # observation, forgotten with the worker's memory, the factor s minimises Σ(1 - s·r)² + k(s - 1)²,
    # and Σr = θ·Σ(x/y), Σr² = θᵀ·Σ(x xᵀ/y²)·θ.
    x_over_y: np.ndarray = field(default_factory=lambda: np.zeros(4))
    xx_over_yy: np.ndarray = field(default_factory=lambda: np.zeros((4, 4)))
    observations: int = 0
    model: TtftModel | None = None  # None: to be computed again
    fleet_epoch: int = -1  # the fleet estimate `model` was computed from
    evicted: OrderedDict[int, None] = field(default_factory=OrderedDict)
    evictions: float = 0.0  # forgotten like the evicted set: per eviction
    refills: float = 0.0


class CostLearner:
    """The fleet's fit of the cost's coefficients and each worker's speed factor. Not thread-safe; one per router."""

    def __init__(self, config: LearningConfig) -> None:
        self.config = config
        self._fleet_fit = LinearFit(4, config.fleet_memory)
        self._fleet = config.prior
        self._fleet_epoch = 0
        self._since_fleet_solve = 0
        self._workers: dict[str, _Worker] = {}
        self._evict_decay = 1.0 - 1.0 / config.eviction_memory
        self._error_decay = 1.0 - 1.0 / config.fleet_memory
        self._worker_decay = 1.0 - 1.0 / config.worker_memory
        self._error_sum = self._error_weight = 0.0
        self._answers: dict[str, tuple[float, int]] = {}  # model: (mean answer tokens, observations)
        # Other processes' statistics (`set_remote`): worker -> (Σx/y, Σxxᵀ/y²); model -> (Σ mean·n, Σ n).
        self._remote_speed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._remote_answers: dict[str, tuple[float, float]] = {}

    def model(self, worker: str) -> TtftModel:
        """The worker's current coefficients: the fleet's times its speed factor (the fleet's
        own for a worker never observed)."""
        w = self._workers.get(worker)
        if w is None:
            if worker not in self._remote_speed:
                return self._fleet
            w = self._worker(worker)
        if w.model is None or w.fleet_epoch != self._fleet_epoch:
            w.model = _scaled(self._fleet, self.speed(worker))
            w.fleet_epoch = self._fleet_epoch
        return w.model

    def speed(self, worker: str) -> float:
        """How much slower than the fleet's model the worker is (1: as predicted; 2: twice as slow)."""
        w, r = self._workers.get(worker), self._remote_speed.get(worker)
        if w is None and r is None:
            return 1.0
        x = (w.x_over_y if w is not None else 0.0) + (r[0] if r is not None else 0.0)
        xx = (w.xx_over_yy if w is not None else 0.0) + (r[1] if r is not None else 0.0)
        theta = np.asarray(_values(self._fleet))
        k = self.config.worker_prior_weight
        den = float(theta @ xx @ theta) + k
        return (float(theta @ x) + k) / den if den > 0 else 1.0

    @property
    def fleet(self) -> TtftModel:
        return self._fleet

    def observations(self, worker: str) -> int:
        w = self._workers.get(worker)
        return 0 if w is None else w.observations

    def _worker(self, worker: str) -> _Worker:
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker()
        return w

    @property
    def relative_error(self) -> float:
        """The fleet's recent mean |predicted - actual| / actual TTFT (0 before any observation)."""
        return self._error_sum / self._error_weight if self._error_weight else 0.0

    def observe_ttft(self, worker: str, f: TtftFeatures, ttft_s: float, predicted_s: float) -> None:
        """A request dispatched with features `f` (and a predicted TTFT of `predicted_s`) had its
        first token `ttft_s` seconds later."""
        if not ttft_s >= 0:
            return
        err = abs(predicted_s - ttft_s) / max(ttft_s, _MIN_TTFT_S)
        self._error_sum = self._error_sum * self._error_decay + min(err, 1.0)
        self._error_weight = self._error_weight * self._error_decay + 1.0
        x = f.vector()
        floor = max(ttft_s, _MIN_TTFT_S)
        w = self._worker(worker)
        if f.running == 0:  # alone on the worker: its speed, not how its queue happened to go
            self._observe_speed(w, x, floor)
        w.observations += 1
        w.model = None
        self._fleet_fit.observe(x, ttft_s, 1.0 / floor**2)
        # Solving the fleet's fit invalidates every worker's model; with many workers, do it once
        # per round of observations rather than on each.
        self._since_fleet_solve += 1
        if self._fleet_epoch == 0 or self._since_fleet_solve >= max(16, len(self._workers)):
            self._since_fleet_solve = 0
            self._fleet = TtftModel(*self._fleet_fit.solve(_values(self.config.prior), _FLEET_PRIOR_WEIGHT))
            self._fleet_epoch += 1

    def _observe_speed(self, w: _Worker, x: tuple[float, ...], ttft_s: float) -> None:
        v = np.asarray(x) / ttft_s
        w.x_over_y *= self._worker_decay
        w.x_over_y += v
        w.xx_over_yy *= self._worker_decay
        w.xx_over_yy += np.outer(v, v)

    def evicted(self, worker: str, hashes: Iterable[int]) -> None:
        """The worker's engine evicted these blocks (router hashes)."""
        w = self._worker(worker)
        n = 0
        for h in hashes:
            w.evicted[h] = None
            w.evicted.move_to_end(h)
            n += 1
        while len(w.evicted) > self.config.eviction_memory:
            w.evicted.popitem(last=False)
        factor = self._evict_decay ** n
        w.evictions = w.evictions * factor + n
        w.refills *= factor

    def stored(self, worker: str, hashes: Iterable[int]) -> None:
        """The worker's engine stored these blocks: those it had evicted are refills."""
        w = self._workers.get(worker)
        if w is None or not w.evicted:
            return
        for h in hashes:
            if h in w.evicted:
                del w.evicted[h]
                w.refills += 1.0

    def refill_ratio(self, worker: str) -> float:
        w = self._workers.get(worker)
        if w is None or w.evictions <= 0:
            return 0.0
        return min(1.0, w.refills / w.evictions)

    def observe_answer(self, model: str, completion_tokens: int) -> None:
        """A request for `model` finished having generated `completion_tokens`: the mean is over all
        answers until `worker_memory` of them, then forgets the older ones at that rate."""
        tokens = float(min(max(completion_tokens, 0), _MAX_ANSWER_TOKENS))
        mean, n = self._answers.get(model, (0.0, 0))
        n += 1
        weight = 1.0 / min(n, self.config.worker_memory)
        if len(self._answers) >= _MAX_MODELS and model not in self._answers:
            self._answers.pop(next(iter(self._answers)))
        self._answers[model] = (mean + weight * (tokens - mean), n)

    def answer_tokens(self, model: str) -> float:
        """The recent mean answer length of `model`'s requests (0 before any finished)."""
        mean, n = self._answers.get(model, (0.0, 0))
        total, weight = self._remote_answers.get(model, (0.0, 0.0))
        if not weight:
            return mean
        n = min(n, self.config.worker_memory)
        return (mean * n + total) / (n + weight)

    def models(self) -> set[str]:
        """The models with a mean answer length, here or in another process."""
        return set(self._answers) | set(self._remote_answers)

    def export(self) -> dict[str, Any]:
        """This process's own statistics (never what `set_remote` added), for the others' `set_remote`."""
        a, b, weight = self._fleet_fit.stats()
        return {"fleet": [a.ravel().tolist(), b.tolist(), weight],
                "speed": {name: [w.x_over_y.tolist(), w.xx_over_yy.ravel().tolist()]
                          for name, w in self._workers.items() if w.x_over_y.any()},
                "answers": {m: [mean, min(n, self.config.worker_memory)] for m, (mean, n) in self._answers.items()}}

    def set_remote(self, parts: Sequence[Mapping[str, Any]]) -> None:
        """The other processes' `export()`s, replacing the previous ones: from now on the fleet's fit,
        the speed factors and the answer lengths are over their observations and this process's.
        ValueError, TypeError or KeyError for a malformed part, and nothing changes."""
        a, b, weight = np.zeros((4, 4)), np.zeros(4), 0.0
        speed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        answers: dict[str, tuple[float, float]] = {}
        for part in parts:
            fa, fb, fw = part["fleet"]
            a, b, weight = a + _array(fa, (4, 4)), b + _array(fb, (4,)), weight + float(fw)
            for name, (x, xx) in part["speed"].items():
                sx, sxx = speed.get(str(name), (np.zeros(4), np.zeros((4, 4))))
                speed[str(name)] = (sx + _array(x, (4,)), sxx + _array(xx, (4, 4)))
            for model, (mean, n) in part["answers"].items():
                total, w = answers.get(str(model), (0.0, 0.0))
                answers[str(model)] = (total + float(mean) * float(n), w + float(n))
        if not (np.isfinite(weight) and weight >= 0 and all(np.isfinite(t) and w >= 0 for t, w in answers.values())):
            raise ValueError("statistics that are not finite")
        previous, self._fleet_fit.remote = self._fleet_fit.remote, ((a, b, weight) if parts else None)
        try:
            self._fleet = TtftModel(*self._fleet_fit.solve(_values(self.config.prior), _FLEET_PRIOR_WEIGHT))
        except ValueError:
            self._fleet_fit.remote = previous
            raise
        self._remote_speed, self._remote_answers = speed, answers
        self._fleet_epoch += 1

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)


def _scaled(model: TtftModel, factor: float) -> TtftModel:
    return TtftModel(*(factor * v for v in _values(model)))


def _array(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    out = np.asarray(values, dtype=np.float64).reshape(shape)
    if not np.isfinite(out).all():
        raise ValueError("statistics that are not finite")
    return out


def _values(model: TtftModel) -> tuple[float, ...]:
    return tuple(float(getattr(model, f.name)) for f in fields(model))
