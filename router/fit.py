"""Online least squares with forgetting, non-negative coefficients and a prior. Pure (numpy only).

`LinearFit` keeps the sufficient statistics of a weighted least-squares problem,

    A = Σ wᵢ xᵢ xᵢᵀ,   b = Σ wᵢ xᵢ yᵢ,   n = Σ fᵢ,   wᵢ = fᵢ·vᵢ,   fᵢ = (1 - 1/memory)^(age of observation i),

with vᵢ the observation's own weight (1/yᵢ² fits relative errors), so one
observation costs O(k²) and the memory is O(k²), whatever the history.
`solve(prior, prior_weight)` returns

    argmin_{θ ≥ 0}  Σ wᵢ (yᵢ - θ·xᵢ)²  +  prior_weight · Σⱼ dⱼ (θⱼ - priorⱼ)²,   dⱼ = Aⱼⱼ / n

`dⱼ` is feature j's mean square, so the prior weighs as much as `prior_weight`
observations for every coefficient whatever its units; a coefficient whose
feature was never non-zero stays at its prior. (With relative weights, dⱼ·Δ² is the
mean squared relative error a deviation Δ in θⱼ makes per observation.) `dⱼ` is capped
at 1/priorⱼ²: a prior whose term alone would be many times the observed values (one
set for other hardware, 100 times too slow) then pulls no harder than `prior_weight`
observations it misses by 100%, instead of outweighing thousands of real ones. Every coefficient of the cost is a
time per unit of work, so it is never negative: the constrained problem is solved
exactly (k is at most 4 here: every active set is tried, the KKT conditions pick the
optimum).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


class LinearFit:
    """y ≈ θ·x over exponentially forgotten observations. Not thread-safe."""

    def __init__(self, n_features: int, memory: float) -> None:
        if n_features < 1 or memory < 2:
            raise ValueError("a fit needs at least one feature and a memory of at least 2 observations")
        self._decay = 1.0 - 1.0 / memory
        self._a = np.zeros((n_features, n_features))
        self._b = np.zeros(n_features)
        self.weight = 0.0  # effective number of observations remembered
        self.observations = 0  # all observations, ever
        # Other processes' statistics (`stats()` of each, summed), added to these when solving: the
        # frontends of `--frontends N` fit one problem over all their observations (router.learning).
        self.remote: tuple[Vector, Vector, float] | None = None

    def stats(self) -> tuple[Vector, Vector, float]:
        """This fit's own (A, b, weight), without `remote`: what another process adds to its own."""
        return self._a.copy(), self._b.copy(), self.weight

    def observe(self, x: Sequence[float], y: float, weight: float = 1.0) -> None:
        v = np.asarray(x, dtype=np.float64)
        self._a *= self._decay
        self._b *= self._decay
        self._a += weight * np.outer(v, v)
        self._b += weight * v * y
        self.weight = self.weight * self._decay + 1.0
        self.observations += 1

    def solve(self, prior: Sequence[float], prior_weight: float) -> tuple[float, ...]:
        p = np.asarray(prior, dtype=np.float64)
        a, b, weight = self._a, self._b, self.weight
        if self.remote is not None:
            a, b, weight = a + self.remote[0], b + self.remote[1], weight + self.remote[2]
        if weight == 0.0:
            return tuple(float(v) for v in p)
        d = np.diag(a) / weight
        seen = d > 0.0
        with np.errstate(divide="ignore"):
            cap = np.where(p > 0.0, 1.0 / np.square(p), np.inf)
        ridge = prior_weight * np.minimum(d, cap)
        m = a + np.diag(ridge)
        v = b + ridge * p
        theta = p.copy()
        if seen.any():
            idx = np.flatnonzero(seen)
            # Coefficients whose feature never appeared stay at the prior: move their part to the right side.
            rest = np.flatnonzero(~seen)
            rhs = v[idx] - m[np.ix_(idx, rest)] @ p[rest]
            theta[idx] = nonnegative_quadratic(m[np.ix_(idx, idx)], rhs)
        return tuple(float(t) for t in theta)


def nonnegative_quadratic(m: Vector, v: Vector) -> Vector:
    """argmin_{θ ≥ 0} ½θᵀmθ - vᵀθ for a small symmetric positive-definite `m` (active sets enumerated)."""
    k = len(v)
    scale = 1.0 / np.sqrt(np.diag(m))  # Jacobi scaling: the tolerance below is then unit-free
    ms = m * np.outer(scale, scale)
    vs = v * scale
    tol = 1e-10 * max(1.0, float(np.abs(vs).max()))
    for size in range(k, 0, -1):
        for free in combinations(range(k), size):
            idx = list(free)
            try:
                sol = np.linalg.solve(ms[np.ix_(idx, idx)], vs[idx])
            except np.linalg.LinAlgError:
                continue
            if (sol < -tol).any():
                continue
            theta = np.zeros(k)
            theta[idx] = np.maximum(sol, 0.0)
            grad = ms @ theta - vs
            if all(grad[i] >= -tol for i in range(k) if i not in free):
                out: Vector = theta * scale
                return out
    return np.zeros(k)
