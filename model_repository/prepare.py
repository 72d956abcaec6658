"""Prepare the default model repository: `python -m model_repository.prepare`.

- LLMs (`backend: "llm"`): convert their weights once into the cache.
- Classic example models: build them from data that ships inside packages.

Idempotent and fast on a second run; nothing here downloads from a model hub.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from engines.weights import cache_dir, read_llm_parameters, resolve_weights

log = logging.getLogger("sluice.prepare")


def prepare_llms(repo: Path) -> None:
    for cfg in sorted(repo.glob("*/config.pbtxt")):
        text = cfg.read_text()
        if '"llm"' not in text:
            continue
        try:
            params = read_llm_parameters(cfg)
        except ValueError:
            continue
        t0 = time.monotonic()
        path = resolve_weights(params["weights"], cfg.parent, cfg.parent.name)
        log.info("LLM %s: %s (%.1fs)", cfg.parent.name, path, time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    repo = args.repository.resolve()
    prepare_llms(repo)
    try:
        from model_repository.classic_build import build_all
    except ImportError:
        log.info("classic example models: builder not present, skipped")
    else:
        t0 = time.monotonic()
        build_all(repo, cache_dir())
        log.info("classic example models ready (%.1fs)", time.monotonic() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
