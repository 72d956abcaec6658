"""Settings every property test shares: bounded, deterministic, and quiet on a shared machine.

`derandomize=True` makes Hypothesis draw the same examples on every run (CI, a laptop), so a
property that passes once passes always until the code changes; `database=None` keeps no
example files behind. `deadline=None` because a loaded 2-core machine makes timings noisy.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def bounded(max_examples: int) -> settings:
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
