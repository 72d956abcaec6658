"""Run the app under uvicorn (HTTP) with gRPC in the same event loop."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from gateway.bootstrap import LLMSpec
from gateway.settings import Settings


def run(settings: Settings, llm_specs: list[LLMSpec] | None = None, log_level: str = "info") -> None:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings, llm_specs)
    # uvicorn's own access log prints query strings; ours logs sizes only.
    uvicorn.run(app, host=settings.host, port=settings.http_port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10)
