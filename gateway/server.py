"""Run the app under uvicorn (HTTP), with gRPC on the same event loop."""

from __future__ import annotations

import uvicorn

from gateway import logs
from gateway.app import create_app
from gateway.http_protocol import protocol_with_header_timeout
from gateway.llm.local import LLMSpec
from gateway.settings import Settings


def run(settings: Settings, llm_specs: list[LLMSpec] | None = None) -> None:
    level = settings.log_level
    logs.configure(level, settings.log_format)
    app = create_app(settings, llm_specs)
    # uvicorn's own access log prints query strings; ours logs sizes only. uvicorn trusts
    # X-Forwarded-For from 127.0.0.1 (or $FORWARDED_ALLOW_IPS) unless told otherwise:
    # here only the proxies named by --forwarded-allow-ips are trusted, none by default.
    # Its connection bound is a backstop above the middleware's request bound, which
    # answers in the route's protocol.
    trusted = settings.forwarded_ips()
    uvicorn.run(app, host=settings.host, port=settings.http_port, log_level=level, access_log=False,
                timeout_graceful_shutdown=10, proxy_headers=bool(trusted), forwarded_allow_ips=trusted or None,
                http=protocol_with_header_timeout(settings.header_timeout_s),
                limit_concurrency=2 * settings.max_inflight_requests, timeout_keep_alive=5,
                log_config=logs.uvicorn_log_config(settings.log_format))
