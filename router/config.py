"""Router configuration, worker descriptions, and the names other layers choose from.

The dataclasses are frozen, validate themselves, and raise ``ValueError`` with
a message an operator can act on. Nothing here does I/O.

This module is the one home of the routing policy names (:data:`POLICIES`, :data:`DEFAULT_POLICY`),
the cost's parameters (:class:`TtftModel`, :data:`COST_PARAMETERS`) and
how they are learned (:class:`LearningConfig`), and the Redis URL schemes
(:data:`REDIS_URL_SCHEMES`, :func:`validate_redis_url`): the gateway's CLI and
settings import them instead of repeating the literals.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

PolicyName = Literal["prefix", "least_load", "round_robin", "session"]
POLICIES: tuple[str, ...] = get_args(PolicyName)
DEFAULT_POLICY: PolicyName = "prefix"
REDIS_URL_SCHEMES: tuple[str, ...] = ("redis://", "rediss://", "unix://")
# RFC 9110 token characters, lower case only: header names compare case-insensitively,
# and one spelling keeps a configured name and the one the gateway looks up equal.
_HEADER_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def validate_redis_url(url: str) -> str:
    """Return `url` unchanged if its scheme is one the Redis client accepts; ValueError otherwise."""
    scheme = next((s for s in REDIS_URL_SCHEMES if url.startswith(s)), None)
    if scheme is None or len(url) == len(scheme):
        raise ValueError(f"redis url must start with {', '.join(REDIS_URL_SCHEMES)} and name a server, "
                         f"got {url!r}")
    return url


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One LLM worker the router may choose.

    `name` is what the gateway shows in `X-Sluice-Worker` and what metrics are
    labelled with: it must stay stable across restarts, so it is never an address.
    """

    name: str
    url: str  # base URL of the worker's HTTP server, e.g. http://127.0.0.1:8100
    models: tuple[str, ...]
    # Tokens per KV block. None: learn it from /metrics (vLLM's cache_config_info)
    # or from KV events, using `default_block_size` from RouterConfig until then.
    block_size: int | None = None
    engine: str = "vllm"
    # vLLM ZMQ PUB address as the router must reach it. If `kv_events_bind` is
    # true the router binds this address and the engine connects to it (vLLM
    # connects whenever its endpoint has a concrete host instead of `*`).
    kv_events_endpoint: str | None = None
    kv_events_bind: bool = False
    kv_events_replay_endpoint: str | None = None  # vLLM's ROUTER socket; always connected to
    kv_events_topic: str = ""
    # TRT-LLM: poll `<url>/kv_cache_events` instead of ZMQ.
    trtllm_events: bool = False
    # KV capacity in blocks, for approximate mode (no events). None: learn it
    # from /metrics (num_gpu_blocks) or use RouterConfig.approx_capacity_blocks.
    capacity_blocks: int | None = None
    # Whether requests to this worker carry the request's `cache_salt`, which namespaces its prefix
    # cache (vLLM, the simulator). False: the gateway sends none (TRT-LLM, plain OpenAI servers), so
    # its cache is shared and the router matches it on the unsalted hash chain its events use.
    salted_cache: bool = True
    # Requests the engine runs at once (vLLM max_num_seqs): one sent to a worker running that many waits
    # in the engine for a slot, whatever its predicted cost. None: unknown.
    max_num_seqs: int | None = None

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"worker name must be non-empty without spaces, got {self.name!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"worker {self.name}: url must start with http:// or https://, got {self.url!r}")
        if not self.models or any(not m for m in self.models):
            raise ValueError(f"worker {self.name}: models must list at least one non-empty model id")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"worker {self.name}: block_size must be >= 1, got {self.block_size}")
        if self.capacity_blocks is not None and self.capacity_blocks < 1:
            raise ValueError(f"worker {self.name}: capacity_blocks must be >= 1")
        if self.kv_events_endpoint is not None and self.trtllm_events:
            raise ValueError(f"worker {self.name}: choose ZMQ kv events or TRT-LLM polling, not both")
        if self.kv_events_bind and self.kv_events_endpoint is None:
            raise ValueError(f"worker {self.name}: kv_events_bind needs kv_events_endpoint")

    @property
    def has_events(self) -> bool:
        """True when the index gets exact updates for this worker."""
        return self.kv_events_endpoint is not None or self.trtllm_events


@dataclass(frozen=True, slots=True)
class TtftModel:
    """One worker's time to first token, in seconds, as the `prefix` cost predicts it (`router.cost`):

        ttft_s = latency_s + running_s × running + token_s × prefill_tokens + pair_s × attention_pairs

    with `running` the requests on the worker, `prefill_tokens` the uncached prompt tokens queued
    ahead of the request plus its own, and `attention_pairs` their query-key pairs.
    `router.learning` fits the coefficients to each worker's observed TTFT; these values are
    only the prior a worker starts from.
    """

    latency_s: float = 0.0  # what every request pays: the hop to the engine, input processing, one step
    running_s: float = 1e-3  # what each running request adds (the decode batch every step carries)
    token_s: float = 1e-4  # seconds per prefill token (the inverse of the prefill rate)
    pair_s: float = 0.0  # seconds per attention query-key pair: long prompts cost super-linearly

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
                raise ValueError(f"cost parameter {f.name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class LearningConfig:
    """How the cost learns its coefficients online (`router.learning`).

    Each worker has its own fit; the fleet's fit, over every worker's observations, is the
    prior of a worker that has seen little (a new worker starts where its peers are), and
    `prior` is the fleet fit's prior until anything is observed.
    """

    prior: TtftModel = field(default_factory=TtftModel)
    # Observations a fit remembers: older ones fade with weight (1 - 1/memory)^age, so a worker
    # that changes (a noisy neighbour, a restart on other hardware) is relearned in about this many.
    worker_memory: int = 256
    fleet_memory: int = 4096
    # How many observations' worth of evidence the prior speed factor (1: the fleet's model as it
    # is) counts for in a worker's own estimate.
    worker_prior_weight: float = 8.0
    # Refills of evicted blocks are tracked for this many evictions per worker (the KV-pressure term).
    eviction_memory: int = 16_384

    def __post_init__(self) -> None:
        if min(self.worker_memory, self.fleet_memory, self.eviction_memory) < 2:
            raise ValueError("worker_memory, fleet_memory and eviction_memory must be >= 2")
        if self.worker_prior_weight < 0:
            raise ValueError("worker_prior_weight must be >= 0")


# The cost's parameters, as `router.learning` fits them and docs/routing.md names them.
COST_PARAMETERS: tuple[str, ...] = tuple(f.name for f in fields(TtftModel))


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Everything the router needs to decide; one per gateway."""

    policy: str = DEFAULT_POLICY
    learning: LearningConfig = field(default_factory=LearningConfig)
    default_block_size: int = 128  # vLLM on CPU; GPU vLLM uses 16
    # Index bounds: each worker keeps at most this many blocks (LRU beyond it).
    max_blocks_per_worker: int = 262_144
    # Speculative entries cover the gap before KV events arrive.
    speculative_ttl_s: float = 30.0
    # Approximate mode (no events): entries live this long unless evicted by the
    # modelled LRU capacity.
    approx_ttl_s: float = 3600.0
    approx_capacity_blocks: int = 4096
    # Health and circuit breaking.
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    unhealthy_after_failures: int = 2
    breaker_failures: int = 3
    breaker_cooldown_s: float = 10.0
    breaker_max_cooldown_s: float = 120.0
    # Load scraping from /metrics; 0 disables it.
    scrape_interval_s: float = 2.0
    scrape_timeout_s: float = 2.0
    # Scraped values older than this are ignored (worker stopped answering).
    scrape_stale_s: float = 10.0
    # KV events.
    trtllm_poll_interval_s: float = 0.5
    replay_timeout_s: float = 2.0
    # Closed loop: accuracy is computed over the last N finished requests.
    accuracy_window: int = 1000
    # The request header whose value is the `session` policy's key; lower case.
    session_header: str = "x-session-id"
    # Bearer key sent to every worker on health checks, /metrics scrapes and TRT-LLM event polls.
    worker_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.default_block_size < 1:
            raise ValueError("default_block_size must be >= 1")
        if self.max_blocks_per_worker < 1 or self.approx_capacity_blocks < 1:
            raise ValueError("max_blocks_per_worker and approx_capacity_blocks must be >= 1")
        for name in ("speculative_ttl_s", "approx_ttl_s", "health_interval_s", "health_timeout_s",
                     "breaker_cooldown_s", "scrape_timeout_s", "scrape_stale_s",
                     "trtllm_poll_interval_s", "replay_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.scrape_interval_s < 0:
            raise ValueError("scrape_interval_s must be >= 0 (0 disables scraping)")
        if self.breaker_max_cooldown_s < self.breaker_cooldown_s:
            raise ValueError("breaker_max_cooldown_s must be >= breaker_cooldown_s")
        if self.breaker_failures < 1 or self.unhealthy_after_failures < 1:
            raise ValueError("breaker_failures and unhealthy_after_failures must be >= 1")
        if self.accuracy_window < 1:
            raise ValueError("accuracy_window must be >= 1")
        if not self.session_header or not set(self.session_header) <= _HEADER_CHARS:
            raise ValueError(f"session_header must be a lower-case HTTP header name such as 'x-session-id', "
                             f"got {self.session_header!r}")


@dataclass(frozen=True, slots=True)
class RedisStateConfig:
    """Routing state shared between gateway replicas through Redis (`router.replicas.redis_state`)."""

    url: str = "redis://127.0.0.1:6379/0"
    password: str | None = field(default=None, repr=False)  # else the URL's own, if any
    ssl_ca_certs: str | None = None  # CA bundle for a rediss:// server
    prefix: str = "sluice:router"
    replica_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    flush_interval_s: float = 0.02
    load_interval_s: float = 1.0
    load_ttl_s: float = 5.0  # a replica silent this long no longer counts toward load
    reconnect_min_s: float = 0.1
    reconnect_max_s: float = 5.0
    socket_timeout_s: float = 3.0
    read_block_ms: int = 500
    max_outbox: int = 100_000
    stream_maxlen: int = 200_000
    max_blocks_per_worker: int = 262_144

    def __post_init__(self) -> None:
        validate_redis_url(self.url)
        if not self.prefix or not self.replica_id:
            raise ValueError("prefix and replica_id must be non-empty")
        for name in ("flush_interval_s", "load_interval_s", "load_ttl_s", "reconnect_min_s",
                     "socket_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        if self.read_block_ms * 2 > self.socket_timeout_s * 1000:
            raise ValueError("socket_timeout_s must exceed twice read_block_ms, or reads time out")
        if min(self.max_outbox, self.stream_maxlen, self.max_blocks_per_worker) < 1:
            raise ValueError("max_outbox, stream_maxlen and max_blocks_per_worker must be >= 1")
