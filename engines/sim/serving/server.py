"""The worker contract over HTTP for one simulated worker (a Starlette app).

Routes, as vLLM serves them: ``POST /v1/completions`` (token ids or text),
``POST /v1/chat/completions`` (the model's own chat template), streamed as SSE or
not; ``GET /v1/models``, ``/health``, ``/metrics``, ``/kv_event_sources``. A client
that disconnects aborts its request in the engine (streamed or not).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engines.sim.model.engine import RequestSpec
from engines.sim.serving.driver import EngineDriver, OutputQueue
from engines.sim.serving.metrics import CONTENT_TYPE, SimMetrics
from engines.sim.serving.openai_requests import ApiError, ParsedRequest, RequestParser, bad_request
from engines.sim.serving.openai_responses import DONE, ResponseShaper, sse
from engines.sim.serving.publisher import KVEventPublisher
from engines.text.detokenizer import IncrementalDetokenizer, decode_after, prompt_context

T = TypeVar("T")


class WorkerView(Protocol):
    """What the routes need from a worker (`engines.sim.serving.worker.SimWorker`)."""

    @property
    def model_name(self) -> str: ...

    parser: RequestParser
    driver: EngineDriver
    metrics: SimMetrics
    publisher: KVEventPublisher | None

    def model_card(self) -> dict[str, Any]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def build_app(worker: WorkerView) -> Starlette:
    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        return JSONResponse(worker.model_card())

    async def metrics(_: Request) -> Response:
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE)

    async def kv_event_sources(_: Request) -> Response:
        return JSONResponse(worker.publisher.sources() if worker.publisher is not None else {})

    async def completions(request: Request) -> Response:
        return await _generate(worker, request, "completion")

    async def chat(request: Request) -> Response:
        return await _generate(worker, request, "chat")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
        Route("/kv_event_sources", kv_event_sources),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


async def _generate(worker: WorkerView, request: Request, kind: str) -> Response:
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    request_id = f"{prefix}-{uuid.uuid4().hex[:16]}"
    try:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise bad_request("the request body is not valid JSON") from None
        parse = worker.parser.chat if kind == "chat" else worker.parser.completion
        parsed = parse(body, request_id)
        queue = worker.driver.submit(RequestSpec(request_id, parsed.prompt_token_ids, parsed.max_tokens,
                                                 parsed.seed, parsed.ignore_eos, parsed.cache_salt))
    except ApiError as e:
        return JSONResponse(e.body(), status_code=e.status)
    except ValueError as e:  # the engine's own refusal
        return JSONResponse(bad_request(str(e)).body(), status_code=400)
    shaper = ResponseShaper(kind, request_id, worker.model_name, int(time.time()),
                            return_token_ids=parsed.return_token_ids, prompt_token_ids=parsed.prompt_token_ids)
    if parsed.stream:
        return StreamingResponse(_stream(worker, parsed, request_id, queue, shaper), media_type="text/event-stream")
    try:
        response = await _unless_disconnected(request, _collect(worker, request_id, queue, shaper,
                                                                        parsed.prompt_token_ids))
    finally:
        worker.driver.abort(request_id)  # a no-op once it finished
    return response if response is not None else Response(status_code=499)  # nobody is listening


async def _stream(worker: WorkerView, parsed: ParsedRequest, request_id: str, queue: OutputQueue,
                  shaper: ResponseShaper) -> AsyncIterator[bytes]:
    # After the prompt's last tokens, as vLLM detokenizes: an answer resumed on this worker after some of
    # its tokens (gateway.llm.migration) reads on exactly where it left off.
    detok = IncrementalDetokenizer(worker.decode, context=prompt_context(worker.decode, parsed.prompt_token_ids))
    try:
        if shaper.chat:
            yield sse(shaper.role_chunk())
        first = True
        while True:
            out = await queue.get()
            if isinstance(out, Exception):
                yield sse(ApiError(500, f"the sim engine failed: {out}", "InternalServerError").body())
                break
            last = out.finish_reason is not None
            text = detok.step(list(out.new_token_ids), last=last).text
            yield sse(shaper.chunk(text, list(out.new_token_ids), out.finish_reason, first))
            first = False
            if last:
                if parsed.include_usage:
                    yield sse(shaper.usage_chunk(out.prompt_tokens, out.completion_tokens, out.cached_tokens))
                break
        yield DONE
    finally:  # also when the client went away and Starlette cancelled us
        worker.driver.abort(request_id)


async def _collect(worker: WorkerView, request_id: str, queue: OutputQueue, shaper: ResponseShaper,
                   prompt: list[int]) -> Response:
    ids: list[int] = []
    while True:
        out = await queue.get()
        if isinstance(out, Exception):
            error = ApiError(500, f"the sim engine failed: {out}", "InternalServerError")
            return JSONResponse(error.body(), status_code=500)
        ids += out.new_token_ids
        if out.finish_reason is not None:
            break
    text = decode_after(worker.decode, prompt_context(worker.decode, prompt), ids)
    return JSONResponse(shaper.response(text, ids, out.finish_reason, out.prompt_tokens, out.cached_tokens))


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Await `work`; None, with `work` cancelled, if the client disconnects first (the body is read)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    finally:
        watcher.cancel()


async def _disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass
