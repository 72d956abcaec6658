"""Per-key usage and access-control metrics. Labels carry a key's public id, never the key."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SecurityMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("sluice_key_requests", "Requests admitted, by API key id.", ["key_id"],
                                registry=registry)
        self.tokens = Counter("sluice_key_tokens", "Tokens used, by API key id and kind (prompt, completion).",
                              ["key_id", "kind"], registry=registry)
        self.rejections = Counter("sluice_key_rejections",
                                  "Requests refused by a quota, by API key id and reason (rpm, tpm, concurrency).",
                                  ["key_id", "reason"], registry=registry)
        self.in_flight = Gauge("sluice_key_requests_in_flight", "Requests in flight on this replica, by API key id.",
                               ["key_id"], registry=registry)
        self.auth_failures = Counter("sluice_auth_failures",
                                     "Requests refused for a missing or wrong key, by what the route needs "
                                     "(api, admin, metrics).", ["access"], registry=registry)
        for access in ("api", "admin", "metrics"):  # at 0 from the start, so rate() sees them
            self.auth_failures.labels(access)
        self.redis_up = Gauge("sluice_quota_redis_up", "1 while quotas are shared through Redis, 0 while this "
                              "replica enforces them locally (no Redis configured, or Redis unreachable).",
                              registry=registry)
        self.quota_local = Gauge("sluice_quota_local", "1 while per-key quotas are configured and this replica "
                                 "enforces them alone (no Redis, or Redis lost): N such replicas may let a key use "
                                 "N times its limits.", registry=registry)
        self.redis_fallbacks = Counter("sluice_quota_redis_fallbacks",
                                       "Times this replica lost Redis and fell back to local quotas.",
                                       registry=registry)
        self.node_fallbacks = Counter("sluice_quota_node_fallbacks",
                                      "Times this frontend of --frontends N could not use the quota table the "
                                      "frontends share and enforced quotas alone.", registry=registry)
