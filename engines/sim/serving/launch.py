"""`sluice worker --engine sim` (and `python -m engines.sim`): one or many simulated workers in one process.

Replica i of ``--replicas N`` listens on HTTP ``--port + i`` and publishes KV events
on ``--kv-events-port + 2i`` (replay on the next port; the default base is
``--port + 1000``); it is named ``--name``-i (default ``sim-<its port>``) and, with
``--gateway``, registered under that name and removed again on exit. `run_sim`
blocks until SIGTERM/SIGINT and returns the exit code: 0 after a requested stop,
1 if a worker could not start or be registered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.launchers import WorkerEnvironment, registration, worker_key_from_args
from engines.launchers.spec import WILDCARD_HOSTS
from engines.launchers.vllm import bind_ipv4
from engines.sim.model.config import SimConfig
from engines.sim.model.profile import Profile, available, load_profile

if TYPE_CHECKING:  # the CLI imports this module to add flags; the servers are imported when they run
    from engines.sim.serving.worker import SimWorker, WorkerSettings

log = logging.getLogger(__name__)

DEFAULT_PROFILE = "vllm-cpu-smollm2-135m"  # the default LLM's
_FALLBACK_MAX_MODEL_LEN = 2048


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """The sim's own flags; the shared ones (--model, --port, --gateway, ...) come from
    `engines.launchers.add_worker_arguments`."""
    g = parser.add_argument_group("sim engine (--engine sim: a modelled vLLM worker; no model runs)")
    g.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"step-time profile: {', '.join(available())}, a JSON file, or numbers "
                        "'base_s=...,prefill_token_s=...,prefill_attn_s=...,decode_seq_s=...' [%(default)s]")
    g.add_argument("--replicas", type=int, default=1, help="workers in this process, on consecutive ports [1]")
    g.add_argument("--num-gpu-blocks", type=int, default=None, help="KV capacity in blocks [the profile's]")
    g.add_argument("--block-size", type=int, default=None, help="tokens per KV block [the profile's, else 128]")
    g.add_argument("--max-num-seqs", type=int, default=None, help="running requests at most [128]")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step at most [2048]")
    g.add_argument("--eos-prob", type=float, default=0.0,
                   help="chance that a generated token is EOS, unless ignore_eos [0: never]")
    g.add_argument("--no-kv-events", action="store_true", help="publish no KV events")


def build_workers(args: argparse.Namespace) -> list[SimWorker]:
    """The fleet `args` describe (loads the tokenizer once). Raises ValueError for bad flags."""
    from transformers import AutoTokenizer  # heavy; only once we know we run

    from engines.sim.serving.worker import SimWorker
    from engines.text.tokenizer import ChatTokenizer
    from engines.weights import resolve_llm

    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    model_dir = resolve_llm(args.model, Path(args.model_repository))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    profile = load_profile(args.profile)
    config = sim_config(args, profile, len(tok), tok.eos_token_id, frozenset(tok.all_special_ids),
                        _max_position_embeddings(model_dir))
    tokenizer = ChatTokenizer(model_dir, tokenizer=tok)
    return [SimWorker(s, config, profile, tokenizer) for s in worker_settings(args, str(model_dir))]


def sim_config(args: argparse.Namespace, profile: Profile, vocab_size: int, eos_token_id: int | None,
               special: frozenset[int], model_max_len: int | None) -> SimConfig:
    """Flags over the profile's engine shape over vLLM-on-CPU defaults."""
    shape: dict[str, Any] = dict(profile.engine)
    for key in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(args, key, None) is not None:
            shape[key] = getattr(args, key)
    max_len = args.max_model_len or model_max_len or _FALLBACK_MAX_MODEL_LEN
    return SimConfig(vocab_size=vocab_size, max_model_len=max_len, cost=profile.cost, eos_token_id=eos_token_id,
                     eos_prob=args.eos_prob, special_token_ids=special, **shape)


def worker_settings(args: argparse.Namespace, model_root: str) -> list[WorkerSettings]:
    from engines.sim.serving.worker import WorkerSettings

    n = args.replicas
    kv_base = args.kv_events_port if args.kv_events_port is not None else args.port + 1000
    http = range(args.port, args.port + n)
    kv = range(kv_base, kv_base + 2 * n)
    if set(http) & set(kv):
        raise ValueError(f"HTTP ports {http.start}-{http.stop - 1} overlap KV-event ports {kv.start}-{kv.stop - 1}; "
                         "set --kv-events-port")
    if http.stop > 65535 or kv.stop > 65535:
        raise ValueError("the fleet's ports run past 65535")
    public = args.advertise_host or ("127.0.0.1" if args.host in WILDCARD_HOSTS else args.host)
    if not args.no_kv_events:
        bind_ipv4(args.host)  # ValueError now, not once the first worker has started
    key = worker_key_from_args(args, WorkerEnvironment.from_environ(), "sim fleet")
    base = WorkerSettings(name="", model_name=args.served_model_name or args.model, model_root=model_root,
                          host=args.host, port=0, public_host=public, kv_events_port=None, worker_key=key)
    out = []
    for i, port in enumerate(http):
        name = (f"{args.name}-{i}" if n > 1 else args.name) if args.name else f"sim-{port}"
        kv_port = None if args.no_kv_events else kv_base + 2 * i
        out.append(replace(base, name=name, port=port, kv_events_port=kv_port))
    return out


def run_sim(args: argparse.Namespace) -> int:
    workers = build_workers(args)
    return asyncio.run(serve_fleet(workers, args.gateway, WorkerEnvironment.from_environ().registration_key))


async def serve_fleet(workers: list[SimWorker], gateway: str | None, registration_key: str | None,
                      stop: asyncio.Event | None = None) -> int:
    """Start every worker, keep them registered (`registration.Keeper`: retried with back-off, never
    fatal), wait for `stop` (default: SIGTERM/SIGINT), deregister, stop."""
    stop = stop or _stop_on_signals()
    started: list[SimWorker] = []
    keepers: list[registration.Keeper] = []
    code = 0
    try:
        for worker in workers:
            await worker.start()
            started.append(worker)
        if gateway:
            keepers = [registration.Keeper(gateway, w.record(), registration_key).start() for w in started]
        log.info("%d sim worker(s) ready", len(started))
        await stop.wait()
    except OSError as e:
        log.error("%s", e)
        code = 1
    finally:
        await asyncio.gather(*(asyncio.to_thread(k.stop) for k in keepers))
        for worker in started:
            await worker.stop()
    return code


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _max_position_embeddings(model_dir: Path) -> int | None:
    """vLLM's default max_model_len: the model config's context length."""
    try:
        value = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) and value > 0 else None
