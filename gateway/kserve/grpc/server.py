"""KServe v2 over gRPC (grpc.aio), on tritonclient's generated GRPCInferenceService stubs.

`start_grpc_server(manager, llm_service, host, port, limits)` returns a started
server; the caller stops it. Errors abort the call with the gRPC code matching
Triton's (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED).
For LLM models, ModelInfer/ModelStreamInfer take a BYTES `text_input` and answer
`text_output` (the stream sends one response per delta). Every call passes the call
gate first (`gateway.kserve.grpc.gate`: drain, key and quotas, RPC slot, before any message
is read), and each request on a ModelStreamInfer stream counts against its key's requests
per minute.

Bounds (`GrpcLimits`): the message size each way, the RPCs in progress at once
(beyond it RESOURCE_EXHAUSTED), the time a unary call's message may take, and per
ModelStreamInfer stream its requests in flight, its write deadline and the bytes of
answers it may queue (`gateway.kserve.grpc.stream`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from engines.classic.errors import InferError, invalid
from engines.classic.manager import ModelRepositoryManager
from engines.classic.repository.names import check_model_name
from engines.classic.request import InferRequest
from engines.errors import ErrorKind, SluiceError
from gateway.cpu_pool import Renderer
from gateway.drain import Drain
from gateway.frontends import channel
from gateway.frontends.channel import Peers
from gateway.kserve import generate, views
from gateway.kserve.errors import grpc_status
from gateway.kserve.grpc import infer as infer_grpc
from gateway.kserve.grpc.gate import CallGate
from gateway.kserve.grpc.limits import GrpcLimits
from gateway.kserve.grpc.stream import Outbox, error_response, serve_stream
from gateway.llm.dispatch import Dispatch
from gateway.llm.service import LLMService
from gateway.security.access import current_key_id
from gateway.security.grpc import GrpcAccess
from gateway.security.guard import Security
from gateway.security.quotas import QuotaService

log = logging.getLogger("sluice.kserve.grpc")


async def _abort(context: grpc.aio.ServicerContext, exc: SluiceError) -> None:
    # An overloaded server says when to retry, as HTTP's Retry-After does.
    retry = () if exc.retry_after_s is None else (("retry-after", str(max(1, round(exc.retry_after_s)))),)
    await context.abort(grpc_status(exc), exc.message, trailing_metadata=retry)


class KServeServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, manager: ModelRepositoryManager, llm_service: LLMService,
                 limits: GrpcLimits | None = None, quotas: QuotaService | None = None,
                 peers: Peers | None = None, pool: Renderer | None = None, drain: Drain | None = None) -> None:
        self.m = manager
        self.drain = drain or Drain()  # SIGTERM's: ServerReady turns false, streams take no new requests
        self.pool = pool or Renderer()  # tokenization of text_input, off the event loop
        self.peers = peers  # sibling frontends of `--frontends N`, asked for statistics
        self.llm = llm_service
        self.llms = llm_service.registry  # what the views read of the LLM path
        self.limits = limits or GrpcLimits()
        self.quotas = quotas

    async def _guard(self, context: grpc.aio.ServicerContext, fn: Any, *args: Any) -> Any:
        try:
            return await fn(*args)
        except SluiceError as exc:
            await _abort(context, exc)
        except Exception as exc:
            log.exception("KServe gRPC handler failed")
            await _abort(context, InferError(f"internal error: {type(exc).__name__}", ErrorKind.INTERNAL))

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.m.ready() and not self.drain.draining)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def run() -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=views.model_ready(self.m, self.llms, request.name, request.version))
        return await self._guard(context, run)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return views.server_metadata()

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def run() -> pb.ModelMetadataResponse:
            return views.model_metadata(self.m, self.llms, request.name, request.version)
        return await self._guard(context, run)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        async def run() -> pb.ModelConfigResponse:
            return pb.ModelConfigResponse(config=views.model_config(self.m, self.llms, request.name, request.version))
        return await self._guard(context, run)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> Any:
        async def run() -> pb.ModelStatisticsResponse:
            snaps = await channel.statistics(self.m, self.peers, request.name, request.version)
            return views.statistics_response(snaps)
        return await self._guard(context, run)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> Any:
        async def run() -> pb.RepositoryIndexResponse:
            rows = views.repository_index(self.m, self.llms, request.ready)
            return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**r) for r in rows])
        return await self._guard(context, run)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: Any) -> Any:
        async def run() -> pb.RepositoryModelLoadResponse:
            config = None
            files: dict[str, bytes] = {}
            for key, param in request.parameters.items():
                value = getattr(param, param.WhichOneof("parameter_choice") or "string_param")
                if key == "config":
                    config = value
                elif key.startswith("file:"):
                    if not isinstance(value, bytes):
                        raise invalid(f"parameter '{key}' must be a bytes_param")
                    files[key[5:]] = value
            await self.m.load(check_model_name(request.model_name), config, files)
            return pb.RepositoryModelLoadResponse()
        return await self._guard(context, run)

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: Any) -> Any:
        async def run() -> pb.RepositoryModelUnloadResponse:
            await self.m.unload(check_model_name(request.model_name))
            return pb.RepositoryModelUnloadResponse()
        return await self._guard(context, run)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return await self._guard(context, self._infer, request)

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        if views.is_llm(self.m, self.llms, check_model_name(request.model_name)):
            return await self._llm_text(request)
        return await self._classic_infer(request)

    async def _classic_infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        params = {k: infer_grpc.param_value(v) for k, v in request.parameters.items()}
        priority = views.int_param(params, "priority")
        timeout_us = views.int_param(params, "timeout")
        extra = {k: v for k, v in params.items() if k not in ("priority", "timeout")}
        inputs = infer_grpc.decode_inputs(request, self.m.limits.max_tensor_elements)
        model = self.m.get_version(request.model_name, request.model_version or None)  # the one lookup
        outputs = await model.infer(InferRequest(request.model_name, model.version, inputs,
                                                 infer_grpc.requested_outputs(request), priority=priority,
                                                 timeout_us=timeout_us, request_id=request.id, parameters=extra))
        return infer_grpc.encode_response(request.model_name, model.version, request.id, outputs)

    async def _llm_start(self, request: pb.ModelInferRequest) -> Dispatch:
        inputs = infer_grpc.decode_inputs(request, self.m.limits.max_tensor_elements)
        prompt = inputs.get("text_input")
        if prompt is None or prompt.size != 1:
            raise invalid("LLM models take one BYTES 'text_input'")
        params = {k: infer_grpc.param_value(v) for k, v in request.parameters.items()}
        text = bytes(prompt.reshape(-1)[0])  # decoded and tokenized off the event loop, within the pool's bound
        return await generate.start(self.llm, self.pool, request.model_name, text, params, current_key_id.get())

    async def _llm_text(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        d = await self._llm_start(request)
        try:
            text = [delta.text async for delta in generate.text_deltas(d)]
        finally:
            d.close()
        return self._text_response(request, "".join(text))

    def _text_response(self, request: pb.ModelInferRequest, text: str, final: bool = True) -> pb.ModelInferResponse:
        response = infer_grpc.encode_response(request.model_name, request.model_version or "1", request.id,
                                              {"text_output": np.array([text.encode()], dtype=np.object_)})
        response.parameters["triton_final_response"].bool_param = final
        return response

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any) -> None:
        """Requests on one stream run concurrently, at most `max_stream_inflight`; each answer (or error)
        carries its request id. Writes are bounded in time and bytes (`gateway.kserve.grpc.stream`)."""
        await serve_stream(request_iterator, context, self.limits, self.drain, self._stream_one)

    async def _stream_one(self, request: pb.ModelInferRequest, outbox: Outbox) -> None:
        try:
            key_id = current_key_id.get()
            if self.quotas is not None and key_id is not None:
                lease = await self.quotas.admit(key_id, hold=False)  # the stream holds the slot
                self.quotas.finish(lease)
            if views.is_llm(self.m, self.llms, check_model_name(request.model_name)):
                await self._stream_llm(request, outbox)
            else:
                await outbox.put(pb.ModelStreamInferResponse(infer_response=await self._classic_infer(request)))
        except SluiceError as exc:
            outbox.push(error_response(request.id, exc.message))
        except Exception as exc:
            log.exception("stream request failed")
            outbox.push(error_response(request.id, f"internal error: {type(exc).__name__}"))

    async def _stream_llm(self, request: pb.ModelInferRequest, outbox: Outbox) -> None:
        d = await self._llm_start(request)
        try:
            async for delta in generate.text_deltas(d):
                response = self._text_response(request, delta.text, final=delta.finish_reason is not None)
                outbox.push(pb.ModelStreamInferResponse(infer_response=response))  # the engine never waits
        finally:
            d.close()


async def start_grpc_server(manager: ModelRepositoryManager, llm_service: LLMService, host: str, port: int,
                            limits: GrpcLimits | None = None, security: Security | None = None,
                            peers: Peers | None = None, pool: Renderer | None = None,
                            drain: Drain | None = None) -> grpc.aio.Server:
    """Create, bind and start the KServe gRPC server; raises RuntimeError if the port cannot be bound.
    `drain` is the app's: gRPC calls count among its requests in flight, and are refused while it drains."""
    limits = limits or GrpcLimits()
    drain = drain or Drain()
    access = GrpcAccess(security, grpc_status) if security is not None else None
    # No `maximum_concurrent_rpcs`: grpc counts a call from its first header, before any key is seen;
    # the gate bounds admitted calls instead.
    server = grpc.aio.server(interceptors=[CallGate(limits, access, drain)],
                             options=[("grpc.max_receive_message_length", limits.max_message_bytes),
                                      ("grpc.max_send_message_length", limits.max_message_bytes),
                                      # Frontends share the port; a single server must not share it
                                      # with a stale one unnoticed (grpc's default is to allow it).
                                      ("grpc.so_reuseport", 1 if peers is not None else 0)])
    servicer = KServeServicer(manager, llm_service, limits, security.quotas if security is not None else None,
                              peers, pool, drain)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"cannot bind the gRPC server to {host}:{port}")
    await server.start()
    return server
