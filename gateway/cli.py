"""`sluice serve` and `sluice worker`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the model repository over OpenAI, KServe v2 HTTP and gRPC")
    p.add_argument("--host", default=os.environ.get("SLUICE_HOST", "0.0.0.0"))
    p.add_argument("--http-port", type=int, default=int(os.environ.get("SLUICE_HTTP_PORT", "8000")))
    p.add_argument("--grpc-port", type=int, default=int(os.environ.get("SLUICE_GRPC_PORT", "8001")),
                   help="0 disables gRPC")
    p.add_argument("--model-repository", type=Path,
                   default=Path(os.environ.get("SLUICE_MODEL_REPOSITORY", "model_repository")))
    p.add_argument("--model-control-mode", choices=["none", "explicit", "poll"], default="none")
    p.add_argument("--load-model", action="append", default=[], help="with explicit mode: load at start")
    p.add_argument("--llm", action="append", default=[],
                   help="serve only these LLMs of the repository (default: all)")
    p.add_argument("--worker", action="append", default=[],
                   help="remote LLM worker, URL or NAME=URL (repeatable); LLMs then come from workers")
    p.add_argument("--workers-file", type=Path, default=None, help="YAML list of worker records")
    p.add_argument("--redis-url", default=os.environ.get("SLUICE_REDIS_URL"),
                   help="share routing state with other gateway replicas through Redis")
    p.add_argument("--routing-policy", default="prefix",
                   choices=["prefix", "least_load", "round_robin", "session"])
    p.add_argument("--routing-weights", default=None, metavar="prefill=1,queued_prefill=1,request=64,kv_usage=512",
                   help="prefix-policy cost weights, in token-equivalents of prefill")
    p.add_argument("--max-running", type=int, default=64, help="admitted requests per model")
    p.add_argument("--max-queued", type=int, default=256, help="queued requests per model before 503")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--max-batch-size", type=int, default=32, help="in-process engine batch size")
    p.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "info"))


def _worker_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("worker", help="start an LLM engine worker (transformers, vllm, trtllm)")
    p.add_argument("--engine", required=True, choices=["transformers", "vllm", "trtllm"])
    try:
        from engines.launchers import add_worker_arguments
    except ImportError:
        p.add_argument("--model", required=True)
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=8100)
        p.add_argument("--gateway", default=None)
        p.add_argument("--name", default=None)
    else:
        add_worker_arguments(p)
    known = {opt for action in p._actions for opt in action.option_strings}
    if "--model-repository" not in known:
        p.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    if "--max-batch-size" not in known:
        p.add_argument("--max-batch-size", type=int, default=32, help="transformers engine batch size")
    if "--log-level" not in known:
        p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _worker_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        return _worker(args)
    except ValueError as e:  # settings validation: a message for the user, not a traceback
        print(f"sluice: {e}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from gateway.server import run
    from gateway.settings import Settings

    repo = args.model_repository
    if not repo.is_dir():
        raise ValueError(f"model repository {repo} does not exist")
    settings = Settings(
        router_config=_router_config(args.routing_policy, args.routing_weights),
        host=args.host, http_port=args.http_port, grpc_port=args.grpc_port, model_repository=repo,
        model_control_mode=args.model_control_mode, load_models=tuple(args.load_model),
        workers=tuple(args.worker), routing_policy=args.routing_policy, max_running=args.max_running,
        max_queued=args.max_queued, max_body_bytes=args.max_body_bytes,
        engine_max_batch_size=args.max_batch_size, served_llms=tuple(args.llm),
        workers_file=args.workers_file, redis_url=args.redis_url,
    )
    run(settings, log_level=args.log_level)
    return 0


def _router_config(policy: str, weights: str | None) -> object:
    from router import CostWeights, RouterConfig

    if not weights:
        return RouterConfig(policy=policy)
    values: dict[str, float] = {}
    for item in weights.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--routing-weights: expected key=value, got {item!r}")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--routing-weights: {key.strip()} must be a number, got {value!r}") from None
    unknown = set(values) - {"prefill", "queued_prefill", "request", "kv_usage"}
    if unknown:
        raise ValueError(f"--routing-weights: unknown weight(s) {', '.join(sorted(unknown))}")
    return RouterConfig(policy=policy, weights=CostWeights(**values))


def _worker(args: argparse.Namespace) -> int:
    if args.engine != "transformers":
        from engines.launchers import run_worker

        return run_worker(args)
    from engines.weights import resolve_llm
    from gateway.bootstrap import LLMSpec
    from gateway.server import run
    from gateway.settings import Settings

    model_dir = resolve_llm(args.model, Path(args.model_repository))
    name = getattr(args, "served_model_name", None) or (
        Path(args.model).name if Path(args.model).is_dir() else args.model)
    advertise = getattr(args, "advertise_host", None)
    settings = Settings(host=args.host, http_port=args.port, grpc_port=0, model_repository=None,
                        engine_max_batch_size=args.max_batch_size, register_with=args.gateway,
                        worker_name=args.name or f"transformers-{args.port}",
                        advertise_url=f"http://{advertise}:{args.port}" if advertise else None)
    run(settings, [LLMSpec(name, model_dir, "transformers", max_batch_size=args.max_batch_size)],
        log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
