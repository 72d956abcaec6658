"""Run the app under uvicorn (HTTP), with gRPC on the same event loop."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from gateway.llm.local import LLMSpec
from gateway.settings import Settings


def run(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> None:
    level = settings.log_level
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings, llm_specs)
    # uvicorn's own access log prints query strings; ours logs sizes only. uvicorn trusts
    # X-Forwarded-For from 127.0.0.1 (or $FORWARDED_ALLOW_IPS) unless told otherwise:
    # here only the proxies named by --forwarded-allow-ips are trusted, none by default.
    trusted = settings.forwarded_ips()
    uvicorn.run(app, host=settings.host, port=settings.http_port, log_level=level, access_log=False,
                timeout_graceful_shutdown=10, proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None)
