"""Large JSON request bodies are decoded and validated off the event loop.

An 8 MiB body of 800,000 one-id lists took the loop 0.8 s to check for depth, 0.6 s to parse
and 1.9 s to validate against the completions schema: every other request waited that long.
A body over `INLINE_JSON_BYTES` is therefore parsed (and, for a route with one body model,
validated) on the CPU pool's threads (`gateway.cpu_pool`), which answer 503 with Retry-After
when every thread is busy; a smaller one takes FastAPI's usual path.

`OffLoopJSONRoute` is the route class of the OpenAI routers; `read_json` serves the KServe
routes that read their body themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from gateway.app_state import state_of
from gateway.cpu_pool import INLINE_JSON_BYTES


def _loads(body: bytes) -> Any:
    """`json.loads`, its decode error as FastAPI reports one (FastAPI catches the exception only
    where it parses the body itself)."""
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}], body=e.doc) from None


def _decode_and_validate(body: bytes, field: Any) -> Any:
    value = _loads(body)
    if field is None:
        return value
    model, errors = field.validate(value, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors, body=value)
    return model  # FastAPI's own validation then passes the model instance through as it is


class OffLoopJSONRoute(APIRoute):
    """An APIRoute whose large JSON bodies are decoded (and validated) on the CPU pool."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        # One body model, not embedded: the route's own body field validates it (as FastAPI would).
        field = self.body_field if len(self.dependant.body_params) == 1 and not self._embed_body_fields else None

        async def off_loop(request: Request) -> Response:
            if "json" in request.headers.get("content-type", ""):
                body = await request.body()
                if len(body) > INLINE_JSON_BYTES:
                    pool = state_of(request).renderer
                    # Starlette's Request.json() returns this; FastAPI then validates a model instance in no time.
                    request._json = await pool.bulk(partial(_decode_and_validate, body, field))
            return await handler(request)

        return off_loop


async def read_json(request: Request, loads: Callable[[bytes], Any]) -> Any:
    """The body as `loads` parses it: on the CPU pool when it is large."""
    body = await request.body()
    if len(body) <= INLINE_JSON_BYTES:
        return loads(body)
    return await state_of(request).renderer.bulk(partial(loads, body))
