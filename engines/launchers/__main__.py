"""`python -m engines.launchers --engine vllm --model M ...`: run_worker without the gateway CLI."""

from __future__ import annotations

import argparse
import logging
import sys

from engines.launchers import ENGINES, add_worker_arguments, run_worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.launchers", description=__doc__)
    parser.add_argument("--engine", choices=ENGINES, required=True)
    add_worker_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
