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

Each worker has its own fit; the fleet's fit sees every observation and is the
prior of each worker's (weighted as `worker_prior_weight` observations), and
`LearningConfig.prior` is the fleet's prior until anything was observed. So a
new worker starts where its peers are and moves to what it does itself, and
nothing set by hand outlives the first few dozen observations.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from router.config import LearningConfig, TtftModel
from router.cost import TtftFeatures
from router.fit import LinearFit

_FLEET_PRIOR_WEIGHT = 1.0  # the configured prior counts as one observation in the fleet's fit
_MIN_TTFT_S = 1e-3  # relative weights of TTFTs below this are capped (a clock's resolution)


@dataclass(slots=True)
class _Worker:
    ttft: LinearFit
    model: TtftModel | None = None  # None: to be solved again
    fleet_epoch: int = -1  # the fleet estimate `model` was solved against
    evicted: OrderedDict[int, None] = field(default_factory=OrderedDict)
    evictions: float = 0.0  # forgotten like the evicted set: per eviction
    refills: float = 0.0


class CostLearner:
    """Per-worker and fleet fits of the cost's coefficients. Not thread-safe; one per router."""

    def __init__(self, config: LearningConfig) -> None:
        self.config = config
        self._fleet_fit = LinearFit(4, config.fleet_memory)
        self._fleet = config.prior
        self._fleet_epoch = 0
        self._since_fleet_solve = 0
        self._workers: dict[str, _Worker] = {}
        self._evict_decay = 1.0 - 1.0 / config.eviction_memory
        self._error_decay = 1.0 - 1.0 / config.fleet_memory
        self._error_sum = self._error_weight = 0.0

    def model(self, worker: str) -> TtftModel:
        """The worker's current coefficients (the fleet's for a worker never observed)."""
        w = self._workers.get(worker)
        if w is None:
            return self._fleet
        if w.model is None or w.fleet_epoch != self._fleet_epoch:
            w.model = TtftModel(*w.ttft.solve(_values(self._fleet), self.config.worker_prior_weight))
            w.fleet_epoch = self._fleet_epoch
        return w.model

    @property
    def fleet(self) -> TtftModel:
        return self._fleet

    def observations(self, worker: str) -> int:
        w = self._workers.get(worker)
        return 0 if w is None else w.ttft.observations

    def _worker(self, worker: str) -> _Worker:
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker(LinearFit(4, self.config.worker_memory))
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
        weight = 1.0 / max(ttft_s, _MIN_TTFT_S) ** 2
        w = self._worker(worker)
        w.ttft.observe(x, ttft_s, weight)
        w.model = None
        self._fleet_fit.observe(x, ttft_s, weight)
        # Solving the fleet's fit invalidates every worker's model; with many workers, do it once
        # per round of observations rather than on each.
        self._since_fleet_solve += 1
        if self._fleet_epoch == 0 or self._since_fleet_solve >= max(16, len(self._workers)):
            self._since_fleet_solve = 0
            self._fleet = TtftModel(*self._fleet_fit.solve(_values(self.config.prior), _FLEET_PRIOR_WEIGHT))
            self._fleet_epoch += 1

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

    def forget(self, worker: str) -> None:
        self._workers.pop(worker, None)


def _values(model: TtftModel) -> tuple[float, ...]:
    return tuple(float(getattr(model, f.name)) for f in fields(model))
