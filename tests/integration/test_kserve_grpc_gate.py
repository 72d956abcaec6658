"""The gRPC call gate against a real `sluice serve` with API keys and a small RPC bound: a call is
authenticated from its metadata before its message is read, so calls that send headers and never
their message cannot take the RPC slots, nor the health probes' answers.

The hostile calls are raw grpc.aio calls whose request iterator never yields: the headers go out,
the message never does. They share a channel (one HTTP/2 connection) with the probes that follow
them, so the server sees them first.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.integration.kserve_support import ECHO_CONFIG, ECHO_PY, start_server, write_model
from tests.integration.security_support import new_key, write_keys

pytestmark = pytest.mark.integration

MAX_RPCS = 4
MESSAGE_TIMEOUT_S = 10
KEY = new_key("gate")
SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    root = Path(tempfile.mkdtemp(prefix="sluice-grpc-gate-"))
    write_model(root / "repo", "echo", ECHO_CONFIG, ECHO_PY)
    keys = write_keys(root / "keys.yaml", {"tenant": (KEY, {})})
    srv = start_server(root, root / "repo", "--api-keys-file", str(keys), "--grpc-max-concurrent-rpcs",
                       str(MAX_RPCS), "--body-timeout-s", str(MESSAGE_TIMEOUT_S))
    yield srv
    srv.stop()


def _infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo", id="probe")
    request.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.arange(4, dtype=np.float32).reshape(1, 4).tobytes())
    return request


def _method(channel: grpc.aio.Channel, name: str, response: type) -> grpc.aio.StreamUnaryMultiCallable:
    """A unary method called as stream-unary: the test decides when (if ever) the message goes."""
    return channel.stream_unary(SERVICE + name, request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=response.FromString)


async def _never() -> AsyncIterator[pb.ModelInferRequest]:
    await asyncio.Event().wait()
    yield pb.ModelInferRequest()  # never reached


async def _silent_calls(channel: grpc.aio.Channel, count: int, metadata: tuple[tuple[str, str], ...]
                        ) -> list[grpc.aio.StreamUnaryCall]:
    """`count` ModelInfer calls whose headers have gone out and whose message never will."""
    infer = _method(channel, "ModelInfer", pb.ModelInferResponse)
    calls = [infer(_never(), metadata=metadata) for _ in range(count)]
    await asyncio.gather(*(call.wait_for_connection() for call in calls))
    return calls


async def _probes_answer(channel: grpc.aio.Channel) -> None:
    live = await channel.unary_unary(SERVICE + "ServerLive", request_serializer=pb.ServerLiveRequest.SerializeToString,
                                     response_deserializer=pb.ServerLiveResponse.FromString)(pb.ServerLiveRequest())
    ready = await channel.unary_unary(SERVICE + "ServerReady",
                                      request_serializer=pb.ServerReadyRequest.SerializeToString,
                                      response_deserializer=pb.ServerReadyResponse.FromString)(pb.ServerReadyRequest())
    assert live.live and ready.ready


async def _keyed_infer(url: str) -> pb.ModelInferResponse:
    async with grpc.aio.insecure_channel(url) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        return await infer(_infer_request(), metadata=(("authorization", f"Bearer {KEY}"),))


async def test_calls_without_a_key_that_never_send_their_message_take_no_slot(server) -> None:
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        calls = [*await _silent_calls(channel, 2 * MAX_RPCS, ()),
                 *await _silent_calls(channel, 2 * MAX_RPCS, (("authorization", "Bearer sk-wrong"),))]
        await _probes_answer(channel)  # on the same connection, after every silent call
        response = await _keyed_infer(server.grpc_url)
        assert np.frombuffer(response.raw_output_contents[0], dtype=np.float32).tolist() == [0, 1, 2, 3]
        for call in calls:  # refused from their headers alone, their message never read
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call, 60)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_keyed_calls_that_never_send_their_message_leave_the_probes_and_time_out(server) -> None:
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        calls = await _silent_calls(channel, MAX_RPCS, (("authorization", f"Bearer {KEY}"),))
        await _probes_answer(channel)  # every RPC slot is held, and the probes still answer
        assert not any(call.done() for call in calls)
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(call, 60)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert err.value.details() == f"the request message did not arrive within {MESSAGE_TIMEOUT_S} s"
        await _keyed_infer(server.grpc_url)  # their slots were freed
