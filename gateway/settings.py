"""One frozen settings object per process: CLI flags over `SLUICE_*` environment variables over defaults.

`sluice serve` passes only the flags given on the command line; every other field
is read from the environment by pydantic-settings (e.g. `SLUICE_HTTP_PORT=9000`,
`SLUICE_WORKERS='["w0=http://10.0.0.5:8100"]'`), else takes its default.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import yaml
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engines.classic.execution.backends.sandbox import resolve_user
from engines.classic.execution.rate_limiter import parse_resources
from engines.classic.limits import ClassicLimits
from engines.classic.manager import CONTROL_MODES
from engines.launchers.registration import WorkerRecord
from engines.launchers.spec import read_worker_key
from gateway.discovery.spec import parse_discovery, require_client
from gateway.llm.admission import AdmissionConfig
from gateway.llm.migration import MigrationConfig
from gateway.logs import LOG_FORMATS
from router import DEFAULT_POLICY, RouterConfig, validate_redis_url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLUICE_", frozen=True, extra="forbid")

    host: str = "0.0.0.0"
    http_port: int = Field(default=8000, ge=0, le=65535)
    grpc_port: int = Field(default=8001, ge=0, le=65535)  # 0 disables gRPC
    model_repository: Path | None = Path("model_repository")
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line
    # LLM serving
    workers: tuple[str, ...] = ()  # remote worker URLs (--worker [NAME=]URL)
    workers_file: Path | None = None  # YAML list of worker records
    k8s_discovery: tuple[str, ...] = ()  # EndpointSlice sources of workers (gateway.discovery.spec)
    redis_url: str | None = None  # share routing state between gateway replicas
    redis_password: str | None = Field(default=None, repr=False)  # SLUICE_REDIS_PASSWORD (or in the URL)
    redis_password_file: Path | None = None  # ... or its first line; the ACL user goes in the URL
    redis_ca_file: Path | None = None  # CA bundle that verifies a rediss:// server (default: the system's)
    routing_policy: str = DEFAULT_POLICY
    # Admission per model (gateway.llm.capacity). None or 0: derived, running = the sum of the healthy
    # workers' batch bounds (vLLM max_num_seqs...), queued = 1x the running limit; a number overrides.
    max_running: int | None = Field(default=None, ge=0)  # admitted requests per model
    max_queued: int | None = Field(default=None, ge=0)  # waiting requests per model before 503
    # Who goes first among waiting LLM requests, within a priority class (gateway.llm.admission.fair).
    admission_order: str = Field(default="fair", pattern="^(fair|fcfs)$")
    max_fanout: int = Field(default=128, ge=1, le=4096)  # engine requests (prompts × n) per API request
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)  # raw and inflated
    # Concurrent HTTP requests before 503. None or 0: derived from the fd limit and memory
    # (gateway.http.budgets.derived_inflight), logged at start.
    max_inflight_requests: int | None = Field(default=None, ge=0)
    header_timeout_s: float = Field(default=10.0, gt=0.0)  # a client's time to send its request headers
    # Request line + header bytes, and header fields, beyond which the protocol layer answers 431
    # (Envoy's defaults: 60 KiB, 100 headers; Apache's LimitRequestFields is 100 too).
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    max_header_count: int = Field(default=100, ge=8)
    # Kept-alive connections with no request in progress (gateway.http.connections): beyond either bound
    # the oldest is closed. Fresh ones (no request yet) are bounded in total only: beyond it, the oldest
    # of the address holding the most is closed. Split between `--frontends`; each total also stays
    # under half the fd limit.
    max_idle_connections_per_client: int = Field(default=256, ge=1)
    max_idle_connections: int = Field(default=4096, ge=1)
    max_fresh_connections: int = Field(default=16384, ge=1)
    body_timeout_s: float = Field(default=30.0, gt=0.0)  # ... and its body
    # An idle kept-alive connection's life: longer than clients keep theirs (httpx and the OpenAI SDKs:
    # 5 s), so that a client never sends a request on a connection the server is closing.
    keep_alive_timeout_s: float = Field(default=75.0, gt=0.0, le=3600.0)
    sse_ping_s: float = Field(default=5.0, gt=0.0)
    # Streamed OpenAI responses relay a remote worker's plain events without decoding each in full
    # (engines.remote.splice). SLUICE_RELAY_SPLICE=false decodes every event (to compare the two).
    relay_splice: bool = True
    # A remote worker's stream that brings at least 3 tokens per this many ms is read once per interval:
    # the tokens that arrive in between reach the client as one event, each at most this much later
    # (fewer reads and writes per token; a slower stream is relayed as it comes). 0: every read at once.
    relay_interval_ms: float = Field(default=20.0, ge=0.0, le=1000.0)
    # On SIGTERM: how long in-flight requests may run on while new ones get 503.
    drain_timeout_s: float = Field(default=30.0, ge=0.0)
    # A worker stream that sent its first chunk and then nothing for this long is ended
    # with an error (a stopped or wedged worker keeps its connection open).
    worker_stall_timeout_s: float = Field(default=60.0, gt=0.0)
    # A stream whose worker is lost mid-answer (its connection failed, or it stalled as above) resumes
    # on the next-best worker this many times at most (0: it ends with an error event, as before);
    # an answer longer than max_migration_replay_tokens is not moved.
    max_migrations: int = Field(default=3, ge=0, le=16)
    max_migration_replay_tokens: int = Field(default=32768, ge=1, le=1 << 20)
    # A client that stops reading: an SSE or gRPC stream whose write has waited this long, or that
    # has this many bytes queued unsent, is ended, its engine request aborted and its slot freed.
    stream_write_timeout_s: float = Field(default=30.0, gt=0.0)
    max_stream_buffer_bytes: int = Field(default=1024 * 1024, ge=4096)
    engine_max_batch_size: int = Field(default=32, ge=1)
    template_timeout_s: float = Field(default=5.0, gt=0.0)  # one chat-template render, off the event loop
    template_threads: int = Field(default=4, ge=1, le=64)  # chat-template renders at once; then wait, then 503
    # Tokenizations and large JSON decodes at once, on threads of their own (renders never wait for them);
    # one key holds at most half of them. Beyond it they wait, then 503.
    bulk_threads: int = Field(default=4, ge=1, le=64)
    # Client text of one request (prompts, messages, text_input, embedding inputs), in characters, before it is
    # tokenized off the event loop; more is refused with 400. None: --max-body-bytes (gRPC's text_input too).
    max_prompt_chars: int | None = Field(default=None, ge=1)
    allow_client_chat_templates: bool = False  # a template is code the server runs
    # Request headers agents send a session or conversation id in (Claude Code, Codex, ...), read after
    # the router's own session header; the first present is the `session` policy's key. Lower case.
    session_headers: tuple[str, ...] = ("x-claude-code-session-id", "session_id", "conversation_id",
                                        "x-conversation-id")
    # Stored Responses API responses (previous_response_id, GET, DELETE): at most this many, this many
    # bytes (a record over an eighth of it is not kept) and this old; also in Redis with --redis-url.
    responses_store_max: int = Field(default=10_000, ge=0)
    responses_store_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    responses_store_ttl_s: float = Field(default=7 * 86400.0, gt=0.0)
    served_llms: tuple[str, ...] = ()  # restrict which LLMs of the repository to load (empty: all)
    # /health: False, ready when this replica can serve (started, not draining, its own engines and
    # repository up); True, also every routed model must have a healthy worker (Triton's strict readiness).
    strict_readiness: bool = False
    # Access control. Key values come from the environment or files only, never from flags
    # (`ps` shows a command line); repr=False: settings get logged, keys must never be.
    api_keys: str | None = Field(default=None, repr=False)  # SLUICE_API_KEYS, comma-separated
    api_keys_file: Path | None = None  # YAML list of {id, key, rpm, tpm, concurrency}, or one key per line
    admin_key: str | None = Field(default=None, repr=False)  # SLUICE_ADMIN_KEY: one admin key (all scopes)
    admin_keys: str | None = Field(default=None, repr=False)  # SLUICE_ADMIN_KEYS, comma-separated
    admin_keys_file: Path | None = None  # entries may list `scopes` (repository, workers, metrics); default all
    registration_key: str | None = Field(default=None, repr=False)  # SLUICE_REGISTRATION_KEY: `workers` scope only
    registration_key_file: Path | None = None  # ... or keys in a file (several: rotation)
    # SLUICE_ATTESTATION_KEY: a secret only the gateway replicas share; it MACs the registrations they
    # share through Redis, so writing Redis cannot admit a discovered worker (gateway.discovery.attest).
    attestation_key: str | None = Field(default=None, repr=False)
    # The key this gateway sends every worker (static, from a file, registered or discovered), as
    # `Authorization: Bearer`: SLUICE_WORKER_KEY, or the first line of --worker-key-file.
    worker_key: str | None = Field(default=None, repr=False)
    worker_key_file: Path | None = None
    metrics_require_key: bool = False  # /metrics then needs an admin key with the `metrics` scope
    metrics_port: int | None = Field(default=None, ge=0, le=65535)  # /metrics on a port of its own too
    otlp_endpoint: str | None = None  # OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces
    forwarded_allow_ips: str = ""  # proxies whose X-Forwarded-For/-Proto uvicorn applies (comma-separated)
    cors_allow_origins: str = ""  # comma-separated; empty: no CORS headers
    # Per-key quotas (0: unlimited); a keys file overrides them per key.
    quota_rpm: int = Field(default=0, ge=0)
    quota_tpm: int = Field(default=0, ge=0)
    quota_concurrency: int = Field(default=0, ge=0)
    # Classic path and KServe gRPC bounds (engines.classic.limits, gateway.kserve.grpc.limits.GrpcLimits,
    # which takes its defaults from here: the settings may not import the gRPC server's package).
    allow_model_uploads: bool = False  # repository loads may carry model files (code run at load)
    classic_max_queue_size: int = Field(default=ClassicLimits().max_queue_size, ge=1)  # per level, if config sets none
    classic_max_tensor_elements: int = Field(default=ClassicLimits().max_tensor_elements, ge=1)
    classic_execute_timeout_s: float = Field(default=ClassicLimits().execute_timeout_s, ge=0.0, allow_inf_nan=False)
    # Run every python model in its own process as this unprivileged user (the server must run as root).
    python_model_user: str | None = None
    rate_limit: str = "off"  # Triton's rate limiter: off, or execution_count
    rate_limit_resources: list[str] = Field(default_factory=list, max_length=64)  # NAME:COUNT
    grpc_max_message_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=2**31 - 1)  # each way
    grpc_max_concurrent_rpcs: int = Field(default=1024, ge=1)  # RPCs in progress at once, streams included
    grpc_max_stream_inflight: int = Field(default=128, ge=1)  # requests of one ModelStreamInfer stream
    # `--frontends N`: N server processes share the ports (gateway.frontends.supervisor); 1: this process serves.
    frontends: int = Field(default=1, ge=1, le=64)
    # Worker mode (`sluice worker --engine transformers --gateway URL`): register there once ready.
    register_with: str | None = None
    worker_name: str | None = None
    advertise_url: str | None = None

    @property
    def has_static_workers(self) -> bool:
        return bool(self.workers or self.workers_file)

    @property
    def workers_only(self) -> bool:
        """LLMs come from workers (static or discovered); none are started in-process."""
        return self.has_static_workers or bool(self.k8s_discovery)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        # Each fact is validated by the layer that owns it, at start-up rather than on first use.
        if self.model_control_mode not in CONTROL_MODES:
            raise ValueError(f"model control mode must be one of {', '.join(CONTROL_MODES)}, "
                             f"got {self.model_control_mode!r}")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        self.router_config()
        if self.redis_url is not None:
            validate_redis_url(self.redis_url)
            self.redis_options()
        elif self.redis_password or self.redis_password_file or self.redis_ca_file:
            raise ValueError("the Redis password and CA options need --redis-url")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp endpoint must be an http:// or https:// URL (OTLP/HTTP), got "
                             f"{self.otlp_endpoint!r}")
        if self.attestation_key is not None and len(self.attestation_key.strip()) < 16:
            raise ValueError("SLUICE_ATTESTATION_KEY must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        for spec in self.k8s_discovery:
            parse_discovery(spec)
        if self.k8s_discovery:
            require_client()
        if self.python_model_user is not None:
            resolve_user(self.python_model_user)  # unknown, privileged, or the server is not root: refused now
        if self.rate_limit not in ("off", "execution_count"):
            raise ValueError(f"rate limit must be off or execution_count, got {self.rate_limit!r}")
        parse_resources(self.rate_limit_resources)
        if self.frontends > 1:
            self._frontends_allowed()
        return self

    def _frontends_allowed(self) -> None:
        """What N copies of the server cannot keep consistent (gateway.frontends.supervisor). Routing
        state, quotas and worker registrations they share (router.replicas.node_state,
        gateway.security.node_quotas, gateway.frontends.registrations); in-process LLMs are refused
        once the repository is read (gateway.frontends.supervisor.check_no_local_llms)."""
        why = None
        if self.http_port == 0 or self.metrics_port == 0:
            why = "the ports must be given (the frontends share them; 0 would give each its own)"
        elif self.model_control_mode == "explicit" or self.allow_model_uploads:
            why = "explicit model control would load or unload a model in one frontend only"
        elif self.register_with is not None:
            why = "a worker registers one URL with its gateway"
        if why is not None:
            raise ValueError(f"--frontends {self.frontends}: {why}")

    def redis_options(self) -> dict[str, str]:
        """redis-py options beyond --redis-url: the password (SLUICE_REDIS_PASSWORD or the first line of
        --redis-password-file) and, for rediss://, the CA. ValueError (never quoting the password)."""
        url = self.redis_url or ""
        options: dict[str, str] = {}
        password = self.redis_password
        if self.redis_password_file is not None:
            try:
                password = (self.redis_password_file.read_text().splitlines() or [""])[0].strip()
            except OSError as e:
                raise ValueError(f"cannot read --redis-password-file {self.redis_password_file}: "
                                 f"{e.strerror}") from None
        if password:
            if urlparse(url).password:
                raise ValueError("the Redis password is given twice: in --redis-url and in SLUICE_REDIS_PASSWORD "
                                 "or --redis-password-file (keep it out of the URL)")
            options["password"] = password
        if self.redis_ca_file is not None:
            if not url.startswith("rediss://"):
                raise ValueError("--redis-ca-file verifies a TLS server: use a rediss:// URL")
            options["ssl_ca_certs"] = str(self.redis_ca_file)
        return options

    def router_config(self) -> RouterConfig:
        # The routing cost has no knobs: it is in seconds and learns its coefficients (docs/routing.md).
        return RouterConfig(policy=self.routing_policy, worker_key=self.resolved_worker_key())

    def resolved_worker_key(self) -> str | None:
        """--worker-key-file over SLUICE_WORKER_KEY; ValueError (not quoting it) for a bad key or file."""
        return read_worker_key(self.worker_key_file, self.worker_key)

    def forwarded_ips(self) -> list[str]:
        return _csv(self.forwarded_allow_ips)

    def cors_origins(self) -> list[str]:
        return _csv(self.cors_allow_origins)

    def prompt_char_limit(self) -> int:
        return self.max_body_bytes if self.max_prompt_chars is None else self.max_prompt_chars

    def migration(self) -> MigrationConfig:
        return MigrationConfig(self.max_migrations, self.max_migration_replay_tokens)

    def admission(self) -> AdmissionConfig:
        return AdmissionConfig(self.max_running or None, self.max_queued or None, self.admission_order == "fair")

    def classic_limits(self) -> ClassicLimits:
        return ClassicLimits(self.classic_max_queue_size, self.classic_max_tensor_elements,
                             self.classic_execute_timeout_s, self.python_model_user,
                             self.rate_limit == "execution_count", parse_resources(self.rate_limit_resources))

    def static_worker_records(self) -> list[WorkerRecord]:
        """The workers named by `--worker [NAME=]URL` (named worker-<index> by default) and `--workers-file`."""
        records = []
        for index, value in enumerate(self.workers):
            name, sep, url = value.partition("=")
            if not sep:
                name, url = f"worker-{index}", value
            if not urlparse(url).hostname:
                raise ValueError(f"--worker {value!r}: expected URL or NAME=URL")
            records.append(WorkerRecord(name=name, url=url, engine="vllm"))
        if self.workers_file is not None:
            data = yaml.safe_load(self.workers_file.read_text()) or []
            items = data.get("workers", []) if isinstance(data, dict) else data
            records += [WorkerRecord.model_validate(item) for item in items]
        return records


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
