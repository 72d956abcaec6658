"""`sluice launch`: write the node scripts and the LeaderWorkerSet manifest of a multi-node launch.

API for the CLI: `add_launch_arguments(parser)` then `run_launch(args)`,
which returns the exit code: 0 when the files are written, 2 when the layout is
refused (the message, on stderr, names the constraint). Nothing is started: the
output is for an operator (bare metal: run `leader.sh` on node 0 and `worker.sh` on
the others) or for `kubectl apply -f leaderworkerset.yaml`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path, PurePath

from engines.launchers.layout import LAUNCH_ENGINES, LayoutError, check_model, layout_from
from engines.launchers.lws import dump, manifests_for
from engines.launchers.plan import DEFAULT_STARTUP_TIMEOUT_S, LaunchPlan, default_name
from engines.launchers.scripts import scripts_for

MANIFEST_FILE = "leaderworkerset.yaml"


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, choices=LAUNCH_ENGINES)
    parser.add_argument("--model", required=True, help="model path (or hub id) every node can load, e.g. /models/X")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size [1]")
    parser.add_argument("--nodes", type=int, required=True, help="nodes in one engine instance")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="[TP × PP / nodes]")
    parser.add_argument("--out", type=Path, default=None, help="output directory [./launch-<name>]")
    parser.add_argument("--name", default=None, help="LeaderWorkerSet name, a DNS label [<engine>-<model>]")
    parser.add_argument("--served-model-name", default=None, help="model id clients use [the model's basename]")
    parser.add_argument("--image", default=None, help="container image with Sluice and the engine "
                                                      "[sluice-<engine>:latest]")
    parser.add_argument("--gateway", default="http://sluice-gateway:8000",
                        help="gateway the leader registers with; '' for none [http://sluice-gateway:8000]")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--startup-timeout-s", type=int, default=DEFAULT_STARTUP_TIMEOUT_S,
                        help="how long the engine may take to become healthy once every node joined "
                             f"[{DEFAULT_STARTUP_TIMEOUT_S}]")
    parser.add_argument("--cpu-per-gpu", type=int, default=6, help="CPU cores each pod requests per GPU [6]")
    parser.add_argument("--memory-gib-per-gpu", type=int, default=32,
                        help="memory (GiB) each pod requests, and is limited to, per GPU [32]")
    parser.add_argument("engine_args", nargs="*", default=[], metavar="-- ENGINE_ARGS",
                        help="extra engine arguments, after a literal --")


def command_line(args: argparse.Namespace) -> str:
    """The flags that decide the output, in one order (not --out), for the files' headers."""
    argv = ["sluice", "launch", "--engine", args.engine, "--model", args.model, "--tp", str(args.tp),
            "--pp", str(args.pp), "--nodes", str(args.nodes)]
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--name", args.name),
                        ("--served-model-name", args.served_model_name), ("--image", args.image),
                        ("--max-model-len", args.max_model_len)):
        if value is not None:
            argv += [flag, str(value)]
    for flag, value, default in (("--startup-timeout-s", args.startup_timeout_s, DEFAULT_STARTUP_TIMEOUT_S),
                                 ("--cpu-per-gpu", args.cpu_per_gpu, 6),
                                 ("--memory-gib-per-gpu", args.memory_gib_per_gpu, 32)):
        if value != default:
            argv += [flag, str(value)]
    if args.gateway != "http://sluice-gateway:8000":
        argv += ["--gateway", args.gateway]
    if args.engine_args:
        argv += ["--", *args.engine_args]
    return " ".join(shlex.quote(a) for a in argv)


def plan_from_args(args: argparse.Namespace) -> LaunchPlan:
    """The checked plan; raises LayoutError naming the constraint a layout breaks."""
    layout = layout_from(args.engine, args.tp, args.pp, args.nodes, args.gpus_per_node)
    check_model(layout, args.model)
    return LaunchPlan(
        layout=layout, model=args.model,
        served_model_name=args.served_model_name or PurePath(args.model.rstrip("/")).name,
        name=args.name or default_name(args.engine, args.model),
        image=args.image or f"sluice-{args.engine}:latest", gateway=args.gateway or None,
        max_model_len=args.max_model_len, engine_args=tuple(args.engine_args or ()),
        command_line=command_line(args), startup_timeout_s=args.startup_timeout_s, cpu_per_gpu=args.cpu_per_gpu,
        memory_gib_per_gpu=args.memory_gib_per_gpu)


def render(plan: LaunchPlan) -> dict[str, str]:
    """File name -> text: one script per node role and the manifest."""
    files = dict(scripts_for(plan))
    files[MANIFEST_FILE] = dump(manifests_for(plan))
    return files


def run_launch(args: argparse.Namespace) -> int:
    try:
        plan = plan_from_args(args)
    except LayoutError as exc:
        print(f"sluice launch: {exc.message}", file=sys.stderr)
        return 2
    out: Path = args.out or Path(f"launch-{plan.name}")
    out.mkdir(parents=True, exist_ok=True)
    files = render(plan)
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
    for warning in plan.layout.warnings():
        print(f"sluice launch: warning: {warning}", file=sys.stderr)
    lay = plan.layout
    print(f"{plan.engine}: TP {lay.tp} × PP {lay.pp} on {lay.nodes} node(s) × {lay.gpus_per_node} GPU(s); "
          f"wrote {', '.join(sorted(files))} to {out}")
    return 0
