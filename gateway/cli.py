"""`sluice serve`, `sluice worker` and `sluice launch`: the one parser of the `sluice` command.

`serve`'s flags are defined here. They default to "not given" so that
`gateway.settings.Settings` can fill every field from a `SLUICE_*` environment
variable, then from its own default: each default lives in one place, the settings
class. `worker` and `launch` reuse the flags engines/ defines once for its own entries
as well (`python -m engines.launchers`, `python -m engines.sim`), since engines/ cannot
import the gateway: `engines.launchers.spec.add_worker_arguments` (every worker),
`engines.sim.serving.launch.add_sim_arguments` (the sim's own) and
`engines.launchers.multinode.add_launch_arguments`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engines.classic.manager import CONTROL_MODES
from gateway.logs import LOG_FORMATS
from router import POLICIES

_UNSET = argparse.SUPPRESS


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the model repository over OpenAI, KServe v2 HTTP and gRPC",
                       argument_default=_UNSET)
    p.add_argument("--host", help="listen address [SLUICE_HOST; 0.0.0.0]")
    p.add_argument("--http-port", type=int, help="OpenAI, KServe HTTP and /metrics [SLUICE_HTTP_PORT; 8000]")
    p.add_argument("--grpc-port", type=int, help="KServe gRPC; 0 disables it [SLUICE_GRPC_PORT; 8001]")
    p.add_argument("--model-repository", type=Path, help="Triton-layout repository [model_repository]")
    p.add_argument("--model-control-mode", choices=CONTROL_MODES, help="[none]")
    p.add_argument("--load-model", dest="load_models", action="append",
                   help="with explicit mode: load at start ('*' for all; repeatable)")
    p.add_argument("--llm", dest="served_llms", action="append",
                   help="serve only these LLMs of the repository (default: all; repeatable)")
    _fleet_flags(p)
    p.add_argument("--routing-policy", choices=POLICIES, help="[prefix]")
    _admission_flags(p)
    p.add_argument("--max-fanout", type=int, help="engine requests (prompts × n) one API request may create [128]")
    p.add_argument("--max-body-bytes", type=int, help="larger request bodies, raw or inflated, get 413 [8 MiB]")
    _connection_flags(p)
    p.add_argument("--max-batch-size", dest="engine_max_batch_size", type=int,
                   help="in-process engine batch size [32]")
    p.add_argument("--template-timeout-s", type=float, help="time limit of one chat-template render [5]")
    p.add_argument("--max-prompt-chars", type=int,
                   help="characters of client text per request, tokenized off the event loop; more get 400 "
                        "[--max-body-bytes]")
    p.add_argument("--allow-client-chat-templates", action="store_true",
                   help="let requests carry their own chat_template (a template is code the server runs)")
    p.add_argument("--strict-readiness", action="store_true",
                   help="/health also needs every worker-served model to have a healthy worker (by default a "
                        "model with none is reported in /health and metrics, and the replica stays ready)")
    p.add_argument("--drain-timeout-s", type=float,
                   help="on SIGTERM, how long in-flight requests may finish while new ones get 503 [30]")
    _worker_fault_flags(p)
    p.add_argument("--relay-interval-ms", type=float,
                   help="read a worker stream that brings 3 tokens or more per this many ms once per interval, "
                        "relaying what came as one event (less CPU per token, each token at most this much "
                        "later); 0: at once [20]")
    p.add_argument("--stream-write-timeout-s", type=float,
                   help="end an SSE or gRPC stream whose client has not taken a write for this long [30]")
    p.add_argument("--max-stream-buffer-bytes", type=int,
                   help="end a stream with this many bytes queued for a client that does not read [1048576]")
    _classic_arguments(p)
    p.add_argument("--frontends", type=int,
                   help="server processes sharing the ports, to use more cores for protocol work [1]")
    p.add_argument("--log-level", help="[SLUICE_LOG_LEVEL; info]")
    p.add_argument("--log-format", choices=LOG_FORMATS, help="text, or json: one object per line [text]")
    _security_flags(p)
    _observability_flags(p)


def _worker_fault_flags(p: argparse.ArgumentParser) -> None:
    """What a stream does when its worker stops answering mid-answer (gateway.llm.migration)."""
    p.add_argument("--worker-stall-timeout-s", type=float,
                   help="end a worker stream that sent nothing for this long after its first chunk [60]")
    p.add_argument("--max-migrations", type=int,
                   help="resume a stream whose worker is lost mid-answer (connection failed, or stalled) on the "
                        "next-best worker at most this many times; 0: it ends with an error event [3]")
    p.add_argument("--max-migration-replay-tokens", type=int,
                   help="do not move an answer longer than this many tokens (its replay is a prefill) [32768]")


def _connection_flags(p: argparse.ArgumentParser) -> None:
    """Bounds on a connection before its request runs (gateway.http.connections)."""
    p.add_argument("--header-timeout-s", type=float, help="time a client may take to send its headers [10]")
    p.add_argument("--max-header-bytes", type=int, help="request line and headers beyond this get 431 [65536]")
    p.add_argument("--max-header-count", type=int, help="more header fields than this get 431 [100]")
    p.add_argument("--max-idle-connections-per-client", type=int,
                   help="kept-alive idle connections per client address (IPv6: per /64); beyond it the oldest is "
                        "closed [256]")
    p.add_argument("--max-idle-connections", type=int,
                   help="kept-alive idle connections in all (at most half the fd limit); beyond it the oldest is "
                        "closed [4096]")
    p.add_argument("--max-fresh-connections", type=int,
                   help="connections not yet sent a request, in all (at most half the fd limit); beyond it the "
                        "oldest of the address holding the most is closed [16384]")
    p.add_argument("--body-timeout-s", type=float, help="time a client may take to send its body [30]")
    p.add_argument("--keep-alive-timeout-s", type=float,
                   help="an idle kept-alive connection is closed after this; keep it above clients' own idle "
                        "expiry (httpx and the OpenAI SDKs: 5 s) [75]")


def _fleet_flags(p: argparse.ArgumentParser) -> None:
    """Where LLM workers come from, and the Redis gateway replicas share."""
    p.add_argument("--worker", dest="workers", action="append",
                   help="remote LLM worker, URL or NAME=URL (repeatable); LLMs then come from workers")
    p.add_argument("--workers-file", type=Path, help="YAML list of worker records")
    p.add_argument("--k8s-discovery", dest="k8s_discovery", action="append", metavar="SPEC",
                   help="find workers in Kubernetes EndpointSlices (repeatable), e.g. 'namespace=sluice,"
                        "selector=app.kubernetes.io/component=vllm-worker,port=http,engine=vllm'")
    p.add_argument("--redis-url", help="share routing state and quotas with other gateway replicas through Redis "
                                       "(redis://[USER@]HOST:PORT/DB, or rediss:// for TLS)")
    p.add_argument("--redis-password-file", type=Path, metavar="PATH",
                   help="Redis password (first line) [also SLUICE_REDIS_PASSWORD]")
    p.add_argument("--redis-ca-file", type=Path, metavar="PATH", help="CA that verifies a rediss:// server [system]")


def _admission_flags(p: argparse.ArgumentParser) -> None:
    """How many requests run, wait and are in flight; each derived unless given (0 means derived too)."""
    p.add_argument("--max-running", type=int,
                   help="admitted requests per model; 0: derived, the sum of its healthy workers' batch bounds "
                        "(vLLM max_num_seqs, ...) [derived]")
    p.add_argument("--max-queued", type=int,
                   help="queued requests per model before 503; 0: derived, 1x the running limit [derived]")
    p.add_argument("--admission-order", choices=("fair", "fcfs"),
                   help="who waits for admission goes first: fair (weighted fair queuing by tokens across "
                        "tenants, within each priority class) or fcfs (arrival order within a class) [fair]")
    p.add_argument("--max-inflight-requests", type=int,
                   help="concurrent HTTP requests before 503; 0: derived from the fd limit (2 per stream) and "
                        "memory, logged at start [derived]")


def _observability_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int,
                   help="also serve /metrics (the same registry) on this port of its own [none]")
    p.add_argument("--otlp-endpoint", metavar="URL",
                   help="export an OpenTelemetry trace per LLM request over OTLP/HTTP, e.g. "
                        "http://collector:4318/v1/traces [none]")


def _security_flags(p: argparse.ArgumentParser) -> None:
    # Key values are never flags (`ps` shows them): SLUICE_API_KEYS / SLUICE_ADMIN_KEYS, or files.
    p.add_argument("--api-keys-file", type=Path, metavar="PATH",
                   help="API keys: YAML list of {id, key, rpm, tpm, concurrency}, or one key per line "
                        "[also SLUICE_API_KEYS, comma-separated]")
    p.add_argument("--admin-keys-file", type=Path, metavar="PATH",
                   help="admin keys; an entry's scopes: repository, workers, metrics (default all) "
                        "[also SLUICE_ADMIN_KEYS, SLUICE_ADMIN_KEY]")
    p.add_argument("--registration-key-file", type=Path, metavar="PATH",
                   help="keys workers register with: the 'workers' scope only [also SLUICE_REGISTRATION_KEY]")
    p.add_argument("--worker-key-file", type=Path, metavar="PATH",
                   help="the key sent to every worker as a bearer token; workers started with the same key "
                        "refuse requests without it [also SLUICE_WORKER_KEY]")
    p.add_argument("--metrics-require-key", action="store_const", const=True,
                   help="/metrics needs an admin key with the 'metrics' scope")
    p.add_argument("--forwarded-allow-ips", metavar="IP,...",
                   help="proxies trusted for X-Forwarded-For/-Proto (comma-separated, CIDR, '*') [none]")
    p.add_argument("--cors-allow-origins", metavar="ORIGIN,...", help="CORS origins (comma-separated, '*') [none]")
    p.add_argument("--quota-rpm", type=int, help="requests per minute per key; 0: unlimited [0]")
    p.add_argument("--quota-tpm", type=int, help="prompt + completion tokens per minute per key; 0: unlimited [0]")
    p.add_argument("--quota-concurrency", type=int, help="requests in flight per key; 0: unlimited [0]")


def _classic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-model-uploads", action="store_true",
                   help="let repository loads carry model files ('file:' parameters), which run at load [off]")
    p.add_argument("--classic-max-queue-size", type=int,
                   help="queued requests per classic model priority level when its config sets none [1024]")
    p.add_argument("--classic-max-tensor-elements", type=int,
                   help="elements per input tensor; larger shapes get 400 [67108864]")
    p.add_argument("--classic-execute-timeout-s", type=float,
                   help="execute() time limit of classic models without their own; 0: none [300]")
    p.add_argument("--python-model-user", metavar="USER",
                   help="run every python model in its own process as this unprivileged user; the server "
                        "must run as root [none: isolated models run as the server's user]")
    p.add_argument("--rate-limit", choices=["off", "execution_count"],
                   help="Triton's rate limiter: an instance runs a batch only holding the resources its "
                        "instance group's rate_limiter names [off]")
    p.add_argument("--rate-limit-resource", dest="rate_limit_resources", action="append", metavar="NAME:COUNT",
                   help="what the server has of a rate-limiter resource (repeatable) [the most one instance asks]")
    p.add_argument("--grpc-max-message-bytes", type=int, help="KServe gRPC message size, each way [64 MiB]")
    p.add_argument("--grpc-max-concurrent-rpcs", type=int, help="KServe gRPC RPCs in progress at once [1024]")
    p.add_argument("--grpc-max-stream-inflight", type=int,
                   help="requests of one ModelStreamInfer stream in flight [128]")


def _worker_parser(sub: Any) -> None:
    from engines.launchers import ENGINES, add_worker_arguments
    from engines.sim.serving.launch import add_sim_arguments

    p = sub.add_parser("worker", help="start an LLM engine worker (transformers, vllm, trtllm, or the sim model)")
    p.add_argument("--engine", required=True, choices=["transformers", *ENGINES, "sim"])
    add_worker_arguments(p)
    add_sim_arguments(p)
    p.add_argument("--max-batch-size", type=int, default=32, help="transformers engine batch size")


def _launch_parser(sub: Any) -> None:
    from engines.launchers.multinode import add_launch_arguments

    p = sub.add_parser("launch", help="write the node scripts and LeaderWorkerSet manifest of a multi-node "
                                      "tensor/pipeline-parallel launch (vLLM on Ray, TensorRT-LLM on MPI)")
    add_launch_arguments(p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _worker_parser(sub)
    _launch_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "launch":
        from engines.launchers.multinode import run_launch

        return run_launch(args)
    try:
        return _serve(args, sys.argv[1:] if argv is None else argv) if args.command == "serve" else _worker(args)
    except ValidationError as e:  # a message for the user, not a traceback
        for err in e.errors():
            where = ".".join(str(p) for p in err.get("loc", ()))
            print(f"sluice: {where + ': ' if where else ''}{err.get('msg')}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"sluice: {e}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace, argv: list[str]) -> int:
    from gateway import logs
    from gateway.frontends.supervisor import Supervisor, check_no_local_llms, check_ports_free, frontend_env
    from gateway.http.server import run
    from gateway.settings import Settings

    given = {k: v for k, v in vars(args).items() if k != "command"}
    for key in ("load_models", "served_llms", "workers", "k8s_discovery"):
        if key in given:
            given[key] = tuple(given[key])
    settings = Settings(**given)
    if settings.model_repository is not None and not settings.model_repository.is_dir():
        raise ValueError(f"model repository {settings.model_repository} does not exist")
    if settings.frontends > 1 and frontend_env() is None:
        ports = [settings.http_port, settings.grpc_port, settings.metrics_port]
        check_ports_free(settings.host, [p for p in ports if p])
        try:
            check_no_local_llms(settings.model_repository, settings.served_llms, settings.workers_only)
        except ValueError as e:
            raise ValueError(f"--frontends {settings.frontends}: {e}") from None
        logs.configure(settings.log_level, settings.log_format)
        # A drain, the 5 s after its deadline and the shutdown: then what is left is killed.
        return Supervisor(argv, settings.frontends, settings.drain_timeout_s + 30.0).run()
    return run(settings)


def _worker(args: argparse.Namespace) -> int:
    if args.engine == "sim":
        import logging

        from engines.sim.serving.launch import run_sim

        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return run_sim(args)
    if args.engine != "transformers":
        from engines.launchers import run_worker

        return run_worker(args)
    from engines.launchers import WorkerEnvironment, worker_key_from_args
    from engines.weights import resolve_llm
    from gateway.http.server import run
    from gateway.llm.local import LLMSpec
    from gateway.settings import Settings

    # The worker is a gateway: its worker key is its one API key (every route but the probes needs it).
    key = worker_key_from_args(args, WorkerEnvironment.from_environ(), f"worker transformers-{args.port}")
    keys: dict[str, Any] = {"api_keys": key} if key else {}  # none given: SLUICE_API_KEYS still applies
    model_dir = resolve_llm(args.model, Path(args.model_repository))
    name = args.served_model_name or (Path(args.model).name if Path(args.model).is_dir() else args.model)
    advertise = args.advertise_host
    settings = Settings(host=args.host, http_port=args.port, grpc_port=0, model_repository=None,
                        engine_max_batch_size=args.max_batch_size, register_with=args.gateway,
                        worker_name=args.name or f"transformers-{args.port}", log_level=args.log_level,
                        advertise_url=f"http://{advertise}:{args.port}" if advertise else None,
                        **keys)
    return run(settings, [LLMSpec(name, model_dir, max_batch_size=args.max_batch_size)])


if __name__ == "__main__":
    sys.exit(main())
