"""The benchmark's peer: KServe's own `ModelServer` serving one ONNX file with onnxruntime.

Runs in the KServe venv (`scripts/ensure_kserve_venv.sh`), never in Sluice's:

    $(scripts/ensure_kserve_venv.sh)/bin/python loadtests/classic/kserve_peer.py \
        --model digits=model.onnx [--model cnn=cnn.onnx] --http_port 8080 --grpc_port 8081

KServe's own flags (`--http_port`, `--grpc_port`, `--workers`...) pass through to its parser.
KServe binds every interface (0.0.0.0 and [::]; 0.21 has no host flag): the benchmark only
sends to 127.0.0.1. Its access log and per-request latency log are turned off, as Sluice's
access log is at `--log-level warning`, so neither server spends time logging.

KServe's v2 data plane (REST with the binary tensor extension, and gRPC) decodes the
request into an `InferRequest`; `predict` runs one onnxruntime session (one thread, as
Sluice's instances do) on the request's tensors as they come: KServe does not batch.
"""

from __future__ import annotations

import argparse
import logging

import kserve
import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse


class OnnxModel(kserve.Model):
    def __init__(self, name: str, path: str, threads: int) -> None:
        super().__init__(name)
        self.path = path
        self.threads = threads
        self.session: ort.InferenceSession | None = None

    def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return True

    # `--workers N` starts N REST processes and hands them the model by pickle: each opens its own session.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "session": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.ready:
            self.load()

    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                      response_headers: dict[str, str] | None = None) -> InferResponse:
        assert self.session is not None
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        wanted = [o.name for o in payload.request_outputs] if payload.request_outputs else self.output_names
        values = self.session.run(wanted, feeds)
        outputs = []
        for name, value in zip(wanted, values, strict=True):
            value = np.ascontiguousarray(value)
            out = InferOutput(name=name, shape=list(value.shape), datatype=_wire(value.dtype))
            out.set_data_from_numpy(value, binary_data=True)
            outputs.append(out)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs,
                             use_binary_outputs=True)


def _wire(dtype: np.dtype) -> str:
    return {"float32": "FP32", "int64": "INT64", "float64": "FP64", "int32": "INT32"}[np.dtype(dtype).name]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH of an ONNX file")
    parser.add_argument("--intra_op_threads", type=int, default=1)
    args, _ = parser.parse_known_args()  # the rest is KServe's (kserve.model_server.parser)
    models = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        model = OnnxModel(name, path, args.intra_op_threads)
        model.load()
        models.append(model)
    server = kserve.ModelServer(enable_latency_logging=False, access_log_format=None)
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).disabled = True
    server.start(models)


if __name__ == "__main__":
    main()
