"""`python -m engines.sim --model M ...`: simulated workers without the gateway's CLI (same flags
as `sluice worker --engine sim`)."""

from __future__ import annotations

import argparse
import logging
import sys

from engines.launchers import add_worker_arguments
from engines.sim.serving.launch import add_sim_arguments, run_sim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.sim", description=__doc__)
    add_worker_arguments(parser)
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run_sim(args)
    except ValueError as e:
        print(f"python -m engines.sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
