"""What a request claims of the admission scheduler: its tenant and weight, its priority class, its
TTFT deadline. Resolved from the key's entitlement (the keys file) and what the request asks
(`X-Sluice-Priority`, `X-Sluice-TTFT-Deadline-Ms`), within what the key allows.

A request may ask for any class its key's `max_priority` reaches, or a less urgent one: asking
above it is refused (403), as is an unknown class or a deadline out of bounds (400). The
classes map onto vLLM's `priority` (lower runs earlier) around 0 for the default class, so a
worker started with `--scheduling-policy priority` orders its own queue the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engines.errors import ErrorKind, SluiceError

# LLM priority classes, most urgent first (gateway.llm.admission): strict priority between them.
PRIORITIES = ("interactive", "standard", "batch")
DEFAULT_PRIORITY = "standard"
MAX_WEIGHT = 1000.0
MAX_DEADLINE_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Entitlement:
    """How a key's LLM requests are scheduled: its share (`weight`, fair queuing within a class), the
    class its requests take (`priority`), the most urgent class a request may ask for with
    `X-Sluice-Priority` (`max_priority`), and the TTFT deadline its requests carry unless they send
    `X-Sluice-TTFT-Deadline-Ms` (None: none)."""

    weight: float = 1.0
    priority: str = DEFAULT_PRIORITY
    max_priority: str = DEFAULT_PRIORITY
    ttft_deadline_ms: int | None = None


DEFAULT_ENTITLEMENT = Entitlement()
DEFAULT_CLASS = PRIORITIES.index(DEFAULT_PRIORITY)
PRIORITY_HEADER = "x-sluice-priority"
DEADLINE_HEADER = "x-sluice-ttft-deadline-ms"


@dataclass(frozen=True, slots=True)
class Asks:
    """What the request asked for, as sent (header values); None: not asked."""

    priority: str | None = None
    ttft_deadline_ms: str | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """How the scheduler treats one request."""

    tenant: str = ""
    weight: float = 1.0
    klass: int = DEFAULT_CLASS  # index into PRIORITIES, 0 most urgent
    deadline_s: float | None = None  # TTFT budget from arrival, seconds

    @property
    def priority(self) -> str:
        return PRIORITIES[self.klass]

    @property
    def engine_priority(self) -> int:
        """vLLM's `priority` for this class: lower is handled earlier, the default class is 0."""
        return self.klass - DEFAULT_CLASS


DEFAULT_CLAIM = Claim()
# (key id, what the request asked) -> its claim; the gateway builds one from its key ring.
ClaimFor = Callable[[str | None, Asks], Claim]


def resolve(tenant: str, ent: Entitlement, asks: Asks) -> Claim:
    """The claim of a request of a key with entitlement `ent` that asked `asks` (SluiceError if it
    asked for more than the key allows, or sent a malformed value)."""
    klass = PRIORITIES.index(ent.priority)
    if asks.priority is not None:
        name = asks.priority.strip().lower()
        if name not in PRIORITIES:
            raise SluiceError(f"X-Sluice-Priority must be one of {', '.join(PRIORITIES)}", ErrorKind.INVALID_ARG,
                              code="invalid_priority")
        klass = PRIORITIES.index(name)
        if klass < PRIORITIES.index(ent.max_priority):
            raise SluiceError(f"this key may ask for priority {ent.max_priority} at most", ErrorKind.PERMISSION_DENIED,
                              code="priority_not_allowed")
    deadline_ms = ent.ttft_deadline_ms
    if asks.ttft_deadline_ms is not None:
        raw = asks.ttft_deadline_ms.strip()
        if not raw.isdigit() or len(raw) > 8 or not 1 <= int(raw) <= MAX_DEADLINE_MS:
            raise SluiceError(f"X-Sluice-TTFT-Deadline-Ms must be an integer in [1, {MAX_DEADLINE_MS}]",
                              ErrorKind.INVALID_ARG, code="invalid_deadline")
        deadline_ms = int(raw)
    return Claim(tenant, ent.weight, klass, None if deadline_ms is None else deadline_ms / 1000.0)


def open_claim(key_id: str | None, asks: Asks) -> Claim:
    """The claim on a gateway without keys: one tenant, any class, any deadline the request asks."""
    return resolve(key_id or "", Entitlement(max_priority=PRIORITIES[0]), asks)


def claims_of(keys: Iterable[tuple[str, str, Entitlement]]) -> ClaimFor:
    """The gateway's claims from its keys' (id, tenant, entitlement) (gateway.security.keys); with no keys,
    `open_claim`."""
    table = {key_id: (tenant, ent) for key_id, tenant, ent in keys}
    if not table:
        return open_claim

    def claim_for(key_id: str | None, asks: Asks) -> Claim:
        tenant, ent = table.get(key_id or "", (key_id or "", Entitlement()))
        return resolve(tenant, ent, asks)
    return claim_for
