"""The access decision both edges share: which key a request presents, and what it may open.

API keys open inference (`Access.API`); admin keys open the admin routes
(`Access.ADMIN`); neither opens the other's routes, though one key may be listed
as both. Without API keys every API request runs as the principal `anonymous`
(the server-wide quota defaults apply to it as one). Without admin keys the
admin routes answer only a direct loopback peer. With `metrics_require_key`,
`/metrics` needs an API or an admin key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from engines.errors import ErrorKind, SluiceError
from gateway.security.access import Access
from gateway.security.keys import KeyEntry, KeyRing, Limits, Principal, from_csv, from_file, single
from gateway.security.metrics import SecurityMetrics
from gateway.security.quotas import QuotaService
from gateway.security.redis_store import RedisQuotaStore
from gateway.settings import Settings

ANONYMOUS = "anonymous"
LOCAL_ADMIN = Principal("local-admin")
_API_HINT = "Send it as 'Authorization: Bearer <key>'."


@dataclass(slots=True)
class Security:
    api: KeyRing
    admin: KeyRing
    quotas: QuotaService
    metrics: SecurityMetrics
    anonymous: Principal  # whom API requests run as when no API key is configured
    metrics_require_key: bool = False
    cors_allow_origins: list[str] = field(default_factory=list)

    def authenticate(self, access: Access, token: str | None, *, local: bool) -> Principal | None:
        """The principal a request runs as (None where no key is involved), or raise
        UNAUTHENTICATED / PERMISSION_DENIED. The token is never part of a message."""
        if access is Access.OPEN or (access is Access.METRICS and not self.metrics_require_key):
            return None
        if access is Access.METRICS:
            as_api, as_admin = self.api.match(token), self.admin.match(token)  # both: no early exit
            if as_api is None and as_admin is None:
                raise self._refuse(access, f"Missing or invalid key for /metrics. {_API_HINT}")
            return None
        if access is Access.ADMIN:
            if not len(self.admin):
                if local:
                    return LOCAL_ADMIN
                raise self._refuse(access, "Admin routes answer only loopback clients when no admin key is "
                                           "configured.", ErrorKind.PERMISSION_DENIED)
            principal = self.admin.match(token)
            if principal is None:
                raise self._refuse(access, f"Missing or invalid admin key. {_API_HINT}")
            return principal
        if not len(self.api):
            return self.anonymous
        principal = self.api.match(token)
        if principal is None:
            raise self._refuse(access, f"Missing or invalid API key. {_API_HINT}")
        return principal

    def _refuse(self, access: Access, message: str, kind: ErrorKind = ErrorKind.UNAUTHENTICATED) -> SluiceError:
        self.metrics.auth_failures.labels(access.value).inc()
        return SluiceError(message, kind)


def build_security(settings: Settings, registry: CollectorRegistry) -> Security:
    """Load the keys (ValueError with a message for the operator) and the quota store."""
    defaults = Limits(settings.quota_rpm, settings.quota_tpm, settings.quota_concurrency)
    api_entries = from_csv(settings.api_keys, "SLUICE_API_KEYS")
    if settings.api_keys_file is not None:
        api_entries += from_file(settings.api_keys_file)
    admin_entries = from_csv(settings.admin_keys, "SLUICE_ADMIN_KEYS")
    admin_entries += single(settings.admin_key)
    if settings.admin_keys_file is not None:
        admin_entries += from_file(settings.admin_keys_file)
    api = KeyRing(api_entries, defaults)
    admin = KeyRing(_unique(admin_entries))  # SLUICE_ADMIN_KEY may repeat one of SLUICE_ADMIN_KEYS
    if settings.metrics_require_key and not (len(api) or len(admin)):
        raise ValueError("--metrics-require-key needs an API key or an admin key to be configured")
    anonymous = Principal(ANONYMOUS, defaults)
    limits = {p.id: p.limits for p in api.principals()} or {ANONYMOUS: defaults}
    metrics = SecurityMetrics(registry)
    store = RedisQuotaStore(settings.redis_url) if settings.redis_url else None
    return Security(api, admin, QuotaService(limits, metrics, store), metrics, anonymous,
                    settings.metrics_require_key, settings.cors_origins())


def _unique(entries: list[KeyEntry]) -> list[KeyEntry]:
    seen: dict[bytes, KeyEntry] = {}
    for e in entries:
        seen.setdefault(e.digest, e)
    return list(seen.values())
