"""The access decision both edges share: which key a request presents, and what it may open.

API keys open inference (`Access.API`); admin keys open the admin routes whose
scope they hold (`repository`, `workers`; all three scopes unless the keys file
says otherwise); neither opens the other's routes, though one key may be listed
as both. The registration key (SLUICE_REGISTRATION_KEY, --registration-key-file)
is an admin key with the `workers` scope alone: what a worker holds to register.
A key of the wrong scope gets PERMISSION_DENIED (403), no key or an unknown one
UNAUTHENTICATED (401). Without API keys every API request runs as the principal
`anonymous` (the server-wide quota defaults apply to it as one). Without any admin
key the admin routes answer only a direct loopback peer that is not a browser page
(`access.browser_refusal`); with one, loopback gets no free pass. With
`metrics_require_key`, `/metrics` needs a key with the `metrics` scope.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from engines.errors import ErrorKind, SluiceError
from gateway.frontends.supervisor import frontend_env
from gateway.security.access import ADMIN, Access
from gateway.security.keys import ALL_SCOPES, KeyEntry, KeyRing, Limits, Principal, from_csv, from_file, single
from gateway.security.metrics import SecurityMetrics
from gateway.security.node_quotas import NodeQuotaStore
from gateway.security.quota_buckets import QuotaStore
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

    def authenticate(self, access: Access, token: str | None, *, local: bool,
                     not_local: str | None = None) -> Principal | None:
        """The principal a request runs as (None where no key is involved), or raise
        UNAUTHENTICATED / PERMISSION_DENIED. `not_local`: why a loopback peer is not
        trusted as local (a browser's request). The token is never part of a message."""
        if access is Access.OPEN or (access is Access.METRICS and not self.metrics_require_key):
            return None
        if access is Access.METRICS:
            self._scoped(access, token, "Missing or invalid key for /metrics.")
            return None
        if access in ADMIN:
            if not len(self.admin):
                if local and not_local is None:
                    return LOCAL_ADMIN
                raise self._refuse(access, not_local or "Admin routes answer only loopback clients when no admin "
                                                        "key is configured.", ErrorKind.PERMISSION_DENIED)
            return self._scoped(access, token, "Missing or invalid admin key.")
        if not len(self.api):
            return self.anonymous
        principal = self.api.match(token)
        if principal is None:
            raise self._refuse(access, f"Missing or invalid API key. {_API_HINT}")
        return principal

    def _scoped(self, access: Access, token: str | None, missing: str) -> Principal:
        principal = self.admin.match(token)
        if principal is None:
            raise self._refuse(access, f"{missing} {_API_HINT}")
        if access.value not in principal.scopes:
            raise self._refuse(access, f"Key '{principal.id}' lacks the '{access.value}' scope this route needs.",
                               ErrorKind.PERMISSION_DENIED)
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
    if any(e.scopes != ALL_SCOPES for e in api_entries):
        raise ValueError("API keys have no scopes: 'scopes' belongs in the admin keys file")
    api = KeyRing(api_entries, defaults)
    # SLUICE_ADMIN_KEY may repeat one of SLUICE_ADMIN_KEYS; a registration key repeating an admin key is refused.
    admin = KeyRing(_unique(admin_entries) + registration_entries(settings))
    if settings.metrics_require_key and not any("metrics" in p.scopes for p in admin.principals()):
        raise ValueError("--metrics-require-key needs an admin key with the 'metrics' scope (every admin key "
                         "holds it unless its keys file entry lists other scopes)")
    anonymous = Principal(ANONYMOUS, defaults)
    limits = {p.id: p.limits for p in api.principals()} or {ANONYMOUS: defaults}
    metrics = SecurityMetrics(registry)
    return Security(api, admin, QuotaService(limits, metrics, _quota_store(settings, limits)), metrics, anonymous,
                    settings.metrics_require_key, settings.cors_origins())


def _quota_store(settings: Settings, limits: dict[str, Limits]) -> QuotaStore | None:
    """Redis when configured; else, in a frontend of `--frontends N` with quotas, the frontends' table."""
    if settings.redis_url:
        return RedisQuotaStore(settings.redis_url, options=settings.redis_options())
    frontend = frontend_env()
    if frontend is not None and any(not lim.unlimited for lim in limits.values()):
        return NodeQuotaStore(frontend[1] / "quotas", frontend[0], settings.frontends)
    return None


def registration_entries(settings: Settings) -> list[KeyEntry]:
    """The registration keys (SLUICE_REGISTRATION_KEY, --registration-key-file): the `workers` scope alone."""
    entries = single(settings.registration_key)
    if settings.registration_key_file is not None:
        entries += from_file(settings.registration_key_file)
    return [KeyEntry(e.digest, e.id or f"registration-{e.digest.hex()[:8]}", None, frozenset({"workers"}))
            for e in _unique(entries)]


def _unique(entries: list[KeyEntry]) -> list[KeyEntry]:
    seen: dict[bytes, KeyEntry] = {}
    for e in entries:
        seen.setdefault(e.digest, e)
    return list(seen.values())
