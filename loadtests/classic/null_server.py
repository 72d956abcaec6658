"""The benchmark's floor: a KServe v2 server that does nothing but the protocol.

It answers `ModelInfer` (grpc.aio) and `POST /v2/models/{m}/infer` (uvicorn + httptools, a raw
ASGI app, binary tensor extension) with ten float32 zeros for each requested output, after
parsing the request as any server must (gRPC: grpcio's protobuf deserializer; HTTP: the body
read in full and its JSON header parsed with orjson). No model runs, nothing is validated,
batched, counted or logged. The same stack as Sluice's and KServe's edges on the same loop,
so its req/s at a concurrency, with the same tritonclient load beside it on the same cores, is
the most any server built on these libraries reaches there; its CPU per request is what the
libraries alone cost.

    .venv/bin/python loadtests/classic/null_server.py --http-port 8000 --grpc-port 8001 [--processes 2]

`--processes N` starts N copies sharing both ports (SO_REUSEPORT), as `sluice serve --frontends N`
does. Started by `bench_servers.py` (target `null server`); only 127.0.0.1 is bound.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
from typing import Any

import grpc
import orjson
import uvicorn
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from uvicorn._compat import asyncio_run

_ZEROS = bytes(40)  # ten float32 zeros


class NullServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        names = [o.name for o in request.outputs] or ["output"]
        return pb.ModelInferResponse(
            model_name=request.model_name, id=request.id,
            outputs=[pb.ModelInferResponse.InferOutputTensor(name=n, datatype="FP32", shape=[1, 10]) for n in names],
            raw_output_contents=[_ZEROS] * len(names))


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] == "GET":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    size = next((int(v) for k, v in scope["headers"] if k == b"inference-header-content-length"), len(body))
    request = orjson.loads(body[:size])
    names = [o["name"] for o in request.get("outputs", [])] or ["output"]
    header = orjson.dumps({"model_name": scope["path"].split("/")[3], "outputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 10], "parameters": {"binary_data_size": 40}} for n in names]})
    payload = header + _ZEROS * len(names)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/octet-stream"), (b"content-length", str(len(payload)).encode()),
        (b"inference-header-content-length", str(len(header)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def serve(config: uvicorn.Config, http_port: int, grpc_port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(NullServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", http_port))
    await uvicorn.Server(config).serve(sockets=[sock])
    await server.stop(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--processes", type=int, default=1)
    args = p.parse_args()
    if args.processes > 1:  # the copies; this process only waits for them and passes signals on
        cmd = [sys.executable, __file__, "--http-port", str(args.http_port), "--grpc-port", str(args.grpc_port)]
        procs = [subprocess.Popen(cmd) for _ in range(args.processes)]
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda s, _f: [q.send_signal(s) for q in procs])
        for q in procs:
            q.wait()
        return
    # As Sluice's server: uvicorn picks the loop (uvloop when installed) and httptools.
    config = uvicorn.Config(app, log_level="warning", access_log=False, http="httptools", lifespan="off")
    asyncio_run(serve(config, args.http_port, args.grpc_port), loop_factory=config.get_loop_factory())


if __name__ == "__main__":
    main()
