"""Worker health: active checks, a circuit breaker, and drain mode.

A worker is *available* for new requests when it is not draining, its active
health check passes, and its breaker lets a request through. The state
machines here are pure (time is passed in); `check_health` is the one I/O step.
Not thread-safe: one event loop owns them.

Breaker states::

    closed --N consecutive failures--> open --cooldown--> half_open
    half_open --probe succeeds--> closed
    half_open --probe fails-----> open (cooldown doubles, up to a maximum)
"""

from __future__ import annotations

import enum

import httpx


class BreakerState(enum.IntEnum):
    # Values are exported as the `sluice_router_worker_breaker_state` gauge.
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """Counts consecutive request failures of one worker."""

    def __init__(self, failure_threshold: int, cooldown_s: float, max_cooldown_s: float) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if cooldown_s <= 0 or max_cooldown_s < cooldown_s:
            raise ValueError("need 0 < cooldown_s <= max_cooldown_s")
        self._threshold = failure_threshold
        self._base_cooldown_s = cooldown_s
        self._max_cooldown_s = max_cooldown_s
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._cooldown_s = cooldown_s
        self._probe_in_flight = False

    def state(self, now: float) -> BreakerState:
        """Current state; an open breaker whose cooldown has passed becomes half-open here."""
        if self._state is BreakerState.OPEN and now - self._opened_at >= self._cooldown_s:
            self._state = BreakerState.HALF_OPEN
            self._probe_in_flight = False
        return self._state

    def allows(self, now: float) -> bool:
        """May a new request go to this worker? Half-open admits one probe at a time."""
        st = self.state(now)
        if st is BreakerState.CLOSED:
            return True
        return st is BreakerState.HALF_OPEN and not self._probe_in_flight

    def on_dispatch(self, now: float) -> None:
        """A request was sent; in half-open it becomes the probe."""
        if self.state(now) is BreakerState.HALF_OPEN:
            self._probe_in_flight = True

    def record_success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._cooldown_s = self._base_cooldown_s
        self._probe_in_flight = False

    def trip(self, now: float) -> None:
        """Open now, whatever the count (the worker was seen lost)."""
        self._failures = max(self._failures, self._threshold)
        if self.state(now) is not BreakerState.OPEN:
            self._open(now, self._base_cooldown_s)

    def record_failure(self, now: float) -> None:
        st = self.state(now)
        self._failures += 1
        if st is BreakerState.HALF_OPEN:
            self._open(now, min(self._cooldown_s * 2, self._max_cooldown_s))
        elif st is BreakerState.CLOSED and self._failures >= self._threshold:
            self._open(now, self._base_cooldown_s)

    def _open(self, now: float, cooldown_s: float) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._cooldown_s = cooldown_s
        self._probe_in_flight = False


class WorkerHealth:
    """Active-check status, drain flag and breaker of one worker.

    A failed check of a worker that has shown it is alive within `alive_window_s` (a first token
    or a finished answer, `note_alive`) does not count: a worker busy enough to miss its check's
    timeout is serving, and marking it unhealthy would turn its fleet's traffic away exactly when
    it is fullest. A dead worker ends its streams with errors and shows nothing, so its checks
    count as before, and its breaker opens on the failed requests.
    """

    def __init__(self, unhealthy_after_failures: int, breaker: CircuitBreaker,
                 alive_window_s: float = 0.0) -> None:
        self._unhealthy_after = unhealthy_after_failures
        self.breaker = breaker
        self.healthy = True  # optimistic until a check says otherwise
        self.draining = False
        self._check_failures = 0
        self._alive_window_s = alive_window_s
        self._alive_at: float | None = None

    def note_alive(self, now: float) -> None:
        """The worker just delivered (a first token or a finished answer)."""
        self._alive_at = now

    def mark_down(self, now: float) -> None:
        """Seen lost mid-answer: unhealthy until a check passes, its breaker open, and its past signs
        of life void (a failed check counts)."""
        self.healthy = False
        self._alive_at = None
        self.breaker.trip(now)

    def record_check(self, ok: bool, now: float = 0.0) -> bool:
        """Result of one active check: one success heals, N failures in a row mark unhealthy.
        True when a failed check was excused because the worker was serving."""
        if ok:
            self._check_failures = 0
            self.healthy = True
            return False
        if self._alive_at is not None and now - self._alive_at <= self._alive_window_s:
            return True
        self._check_failures += 1
        if self._check_failures >= self._unhealthy_after:
            self.healthy = False
        return False

    def available(self, now: float) -> bool:
        return not self.draining and self.healthy and self.breaker.allows(now)


async def check_health(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> bool:
    """GET `<base_url>/health`; True on a 2xx answer within the timeout. Never raises for I/O."""
    try:
        resp = await client.get(base_url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return resp.is_success
