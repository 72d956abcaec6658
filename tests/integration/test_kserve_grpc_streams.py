"""ModelStreamInfer against a real `sluice serve` in front of a SIM worker (a modelled engine that
streams tokens at a set pace), with a real grpc client: a client that stops reading is cut (write
deadline, or bytes queued) and its engine request and slots freed; SIGTERM drains gRPC as it
drains HTTP.

The client that stops reading is a grpc.aio stream whose answers are never read, on a channel
with BDP probing off: grpc's receive window then stays at 64 KiB, so once that much is unread
the server's writes wait. No test times anything; waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb

from tests.integration.conftest import MODEL
from tests.integration.vllm_support import sim_worker
from tests.servers import Server, metric_value, start_server

pytestmark = pytest.mark.integration

PROFILE = "base_s=0.01,decode_seq_s=0.0001"  # about 100 tokens a second
SERVICE = "/inference.GRPCInferenceService/"
NOT_READING = [("grpc.http2.bdp_probe", 0)]


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with sim_worker(MODEL, PROFILE) as url:
        yield url


def _gateway(sim_url: str, tmp: Path, *flags: str) -> Server:
    (tmp / "repo").mkdir()
    return start_server(["--model-repository", str(tmp / "repo"), "--worker", f"sim={sim_url}", *flags],
                        tmp / "gateway.log", grpc=True)


def _generate(request_id: str, max_tokens: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=MODEL, id=request_id)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    text = f"a stream for {request_id}".encode()
    request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["ignore_eos"].bool_param = True
    return request


def _stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(SERVICE + "ModelStreamInfer",
                                 request_serializer=pb.ModelInferRequest.SerializeToString,
                                 response_deserializer=pb.ModelStreamInferResponse.FromString)


def _unary(channel: grpc.aio.Channel, name: str, request: type, response: type) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(SERVICE + name, request_serializer=request.SerializeToString,
                               response_deserializer=response.FromString)


async def _send_then_hold(requests: list[pb.ModelInferRequest], done: asyncio.Event
                          ) -> AsyncIterator[pb.ModelInferRequest]:
    for request in requests:
        yield request
    await done.wait()  # the request side stays open until the test is done with the stream


async def _poll(check, what: str, tries: int = 600) -> None:
    for _ in range(tries):  # bounded: 60 s
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


def _gauge(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    return metric_value(httpx.get(url + "/metrics", timeout=10).text, name, labels) or 0.0


async def _final_answer(url: str, request: pb.ModelInferRequest) -> list[pb.ModelStreamInferResponse]:
    """Every answer to `request` on a stream of its own, read until its final one."""
    answers: list[pb.ModelStreamInferResponse] = []
    async with grpc.aio.insecure_channel(url) as channel:
        call = _stream(channel)(_send_then_hold([request], asyncio.Event()))
        async for answer in call:
            answers.append(answer)
            if answer.error_message or answer.infer_response.parameters["triton_final_response"].bool_param:
                break
        call.cancel()
    return answers


async def _cut_and_freed(gateway: Server, sim_url: str) -> grpc.aio.AioRpcError:
    """Open a stream of one long generation and never read it; once the server has cut it, check that its
    engine request was aborted, its admission slot is free and another stream is served; return the
    error the stalled call ends with once it reads again."""
    done = asyncio.Event()
    generated = _gauge(sim_url, "vllm:generation_tokens_total")
    stalled_channel = grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}", options=NOT_READING)
    stalled = _stream(stalled_channel)(_send_then_hold([_generate("stalled", 1900)], done))
    try:
        await _poll(lambda: _gauge(sim_url, "vllm:num_requests_running") == 1, "the generation to run")
        await _poll(lambda: _gauge(sim_url, "vllm:num_requests_running") == 0, "the engine request to end")
        assert _gauge(sim_url, "vllm:generation_tokens_total") - generated < 1900  # aborted, not finished
        assert _gauge(gateway.url, "sluice_requests_inflight", {"model": MODEL}) == 0
        answers = await _final_answer(f"127.0.0.1:{gateway.grpc_port}", _generate("next", 8))
        assert not answers[-1].error_message and len(answers) >= 1
        received = 0
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stalled:  # what grpc had buffered for it, then the status
                received += 1
        assert 0 < received < 1900
        return err.value
    finally:
        done.set()
        stalled.cancel()
        await stalled_channel.close()


async def test_a_stream_whose_client_stops_reading_is_cut_at_the_write_deadline(sim_url: str,
                                                                              tmp_path: Path) -> None:
    gateway = _gateway(sim_url, tmp_path, "--stream-write-timeout-s", "1", "--max-running", "1")
    try:
        error = await _cut_and_freed(gateway, sim_url)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "took no answer for 1 s (--stream-write-timeout-s)" in (error.details() or "")
    finally:
        gateway.stop()


async def test_a_stream_with_too_many_bytes_queued_unsent_is_cut(sim_url: str, tmp_path: Path) -> None:
    gateway = _gateway(sim_url, tmp_path, "--stream-write-timeout-s", "600", "--max-stream-buffer-bytes", "4096",
                       "--max-running", "1")
    try:
        error = await _cut_and_freed(gateway, sim_url)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "bound of 4096 (--max-stream-buffer-bytes)" in (error.details() or "")
    finally:
        gateway.stop()


async def test_sigterm_drains_grpc_streams_refuses_new_calls_and_turns_not_ready(sim_url: str,
                                                                                tmp_path: Path) -> None:
    gateway = _gateway(sim_url, tmp_path, "--drain-timeout-s", "120")
    url = f"127.0.0.1:{gateway.grpc_port}"
    try:
        done = asyncio.Event()
        async with grpc.aio.insecure_channel(url) as channel:
            call = _stream(channel)(_send_then_hold([_generate("draining", 300)], done))
            answers = [await call.read()]
            gateway.proc.send_signal(signal.SIGTERM)
            ready = _unary(channel, "ServerReady", pb.ServerReadyRequest, pb.ServerReadyResponse)
            for _ in range(600):  # bounded: the signal is handled on the server's loop
                if not (await ready(pb.ServerReadyRequest())).ready:
                    break
                await asyncio.sleep(0.05)
            assert not (await ready(pb.ServerReadyRequest())).ready
            live = await _unary(channel, "ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse)(
                pb.ServerLiveRequest())
            assert live.live
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _unary(channel, "ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse)(
                    _generate("refused", 4))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (err.value.details() or "")
            assert ("retry-after", "1") in tuple(err.value.trailing_metadata() or ())
            while not answers[-1].infer_response.parameters["triton_final_response"].bool_param:
                answers.append(await call.read())
            done.set()  # the client closes its side: the stream ends normally
            assert await call.read() == grpc.aio.EOF and await call.code() == grpc.StatusCode.OK
        assert not any(a.error_message for a in answers)
        text = b"".join(a.infer_response.raw_output_contents[0][4:] for a in answers)
        assert len(answers) > 1 and text
        assert gateway.proc.wait(timeout=60) == 0
        assert "drained: no request in flight" in gateway.log()
    finally:
        gateway.stop()
