"""Pieces of bench_lowcost.py: the request bodies the C clients send, Sluice's counters, the OCR
pipeline in-process (the limit), the summary and the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests.classic.servers import MODELS, Target, threaded_latencies

OCR = "ocr"
OCR_OUTPUTS = ("BOXES", "TEXTS", "SCORES")


def ocr_page() -> bytes:
    """The page every OCR request sends: three lines on noise, 736 x 736 px (tests/integration/ocr_support.py)."""
    from tests.integration.ocr_support import one_line_pages

    page = one_line_pages(1)[0]
    return type(page)(("Triton-compatible serving", "with dynamic batching", "over KServe v2"), page.size,
                      seed=7).png()


def _bytes_element(data: bytes) -> bytes:
    """One BYTES element as KServe's binary extension and gRPC raw contents carry it: length, then bytes."""
    return len(data).to_bytes(4, "little") + data


def _tensors(model: str, data: dict[str, Path], page: bytes) -> tuple[list[dict], list[bytes], list[str]]:
    """(inputs as JSON headers, their raw bytes, the outputs asked for) of one request."""
    if model == OCR:
        raw = _bytes_element(page)
        return [{"name": "IMAGE", "shape": [1], "datatype": "BYTES"}], [raw], list(OCR_OUTPUTS)
    spec = MODELS[model]
    x = np.ascontiguousarray(np.load(data[model])[:1], dtype=np.float32)
    return [{"name": spec["input"], "shape": list(x.shape), "datatype": "FP32"}], [x.tobytes()], [spec["output"]]


def request_bodies(root: Path, data: dict[str, Path], page: bytes) -> dict[str, dict[str, Any]]:
    """Per model: the HTTP body file (JSON header + tensors) and its header's length; per model name, the
    gRPC body file (a length-prefixed ModelInferRequest, as gRPC frames a message)."""
    from tritonclient.grpc import service_pb2

    names = {"digits": ("digits", "digits_dyn", "digits_nodyn"), "cnn": ("cnn", "cnn_dyn", "cnn_nodyn"), OCR: (OCR,)}
    out: dict[str, dict[str, Any]] = {}
    for model, model_names in names.items():
        inputs, raws, outputs = _tensors(model, data, page)
        header = json.dumps({
            "inputs": [{**i, "parameters": {"binary_data_size": len(r)}} for i, r in zip(inputs, raws, strict=True)],
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}).encode()
        http = root / f"{model}.http.bin"
        http.write_bytes(header + b"".join(raws))
        grpc = {}
        for name in model_names:
            message = service_pb2.ModelInferRequest(
                model_name=name, inputs=[service_pb2.ModelInferRequest.InferInputTensor(
                    name=i["name"], datatype=i["datatype"], shape=i["shape"]) for i in inputs],
                outputs=[service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=o) for o in outputs],
                raw_input_contents=raws).SerializeToString()
            grpc[name] = root / f"{name}.grpc.bin"
            grpc[name].write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
        out[model] = {"http": http, "header": len(header), "grpc": grpc}
    return out


def sluice_counts(target: Target, model: str) -> tuple[int, int, int] | None:
    """Sluice's (rows, failed requests, executions) for the model (for OCR: the recogniser's crops and
    runs, the pipeline's failures); None for a server without KServe statistics."""
    if target.stats_url is None or model not in target.names:
        return None

    def stats(name: str) -> dict[str, Any]:
        return httpx.get(f"http://{target.http}/v2/models/{name}/stats", timeout=30).json()["model_stats"][0]

    own = stats(target.model_name(model))
    failed = int(own["inference_stats"]["fail"]["count"])
    counted = stats("ocr_rec") if model == OCR else own
    return int(counted["inference_count"]), failed, int(counted["execution_count"])


def inprocess_ocr(repo: Path, page: bytes, levels: list[int], duration_s: float) -> dict[str, Any]:
    """The OCR pipeline's steps and its three networks in this process (one-thread sessions, as the
    server's instances), from `c` threads: the most a server could do on this machine."""
    import onnxruntime as ort

    from model_repository import ocr_pipeline as ocr

    def session(name: str) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        return ort.InferenceSession(str(repo / name / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"])

    det, cls, rec = session("ocr_det"), session("ocr_cls"), session("ocr_rec")
    characters = ocr.rec_characters(rec.get_modelmeta().custom_metadata_map["character"])

    def read() -> None:
        fitted, _ = ocr.fit(ocr.decode(page))
        found = ocr.boxes(det.run(None, {"x": ocr.det_input(fitted)})[0], *fitted.shape[:2])
        crops = [ocr.crop(fitted, b) for b in found]
        crops = ocr.upright(crops, cls.run(None, {"x": ocr.cls_input(crops)})[0])
        widths = ocr.rec_widths(crops)
        for width in set(widths):
            rows = [c for c, w in zip(crops, widths, strict=True) if w == width]
            ocr.ctc_decode(rec.run(None, {"x": ocr.rec_input(rows, width)})[0], characters)

    out = []
    for c in levels:
        lat, elapsed = threaded_latencies(lambda _: read(), c, duration_s)
        lat, n = lat * 1000, len(lat)
        out.append({"concurrency": c, "throughput_rps": round(n / elapsed, 2),
                    "p50_ms": round(float(lat[n // 2]), 1), "p99_ms": round(float(lat[min(n - 1, int(0.99 * n))]), 1)})
    print(f"in-process ocr: {out}", flush=True)
    return {"by_concurrency": out}


def _at(series: list[dict], model: str, proto: str, target: str, c: int) -> dict[str, Any] | None:
    for s in series:
        if (s["model"], s["protocol"], s["target"]) == (model, proto, target):
            return next((r for r in s["results"] if r["concurrency"] == c), None)
    return None


def summarise(series: list[dict], limits: dict[str, Any]) -> dict[str, Any]:
    """The targets the issue set: Sluice vs KServe at c=32 (binary HTTP and gRPC), server CPU per request
    at c=1, each with the client's CPU per request and the null server's floor beside it."""
    out: dict[str, Any] = {}
    for model in (m for m in ("digits", "cnn") if m in limits):
        for proto in ("http", "grpc"):
            sluice, kserve = _at(series, model, proto, "sluice batched", 32), _at(series, model, proto, "kserve", 32)
            null = _at(series, model, proto, "null server", 32)
            one = _at(series, model, proto, "sluice unbatched", 1)
            if not (sluice and kserve):
                continue
            out[f"{model}, {proto}"] = {
                "sluice_rps_at_32": sluice["throughput_rps"], "kserve_rps_at_32": kserve["throughput_rps"],
                "vs_kserve_at_32": round(sluice["throughput_rps"] / kserve["throughput_rps"], 2),
                "null_server_rps_at_32": null["throughput_rps"] if null else None,
                "client_cpu_us_per_req_at_32": {"sluice": sluice["client_cpu_us_per_req"],
                                                "kserve": kserve["client_cpu_us_per_req"]},
                "server_cpu_us_per_req_at_32": {"sluice": sluice["server_cpu_us_per_req"],
                                                "kserve": kserve["server_cpu_us_per_req"]},
                "sluice_server_cpu_us_per_req_at_1_unbatched": one["server_cpu_us_per_req"] if one else None,
                "sluice_p99_ms_at_32": sluice["p99_ms"], "kserve_p99_ms_at_32": kserve["p99_ms"],
            }
    if OCR in limits:
        out[OCR] = {proto: [{k: r.get(k) for k in ("concurrency", "throughput_rps", "p50_ms", "p99_ms",
                                                    "avg_batch_rows", "client_cpu_us_per_req")}
                            for r in (next((s["results"] for s in series if (s["model"], s["protocol"], s["target"])
                                            == (OCR, proto, "sluice batched")), []))]
                    for proto in ("http", "grpc")}
        out[OCR]["inprocess"] = limits[OCR]["by_concurrency"]
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(s["model"] for s in report["series"]))
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 8), squeeze=False)
    for col, model in enumerate(models):
        rps, p99 = axes[0][col], axes[1][col]
        for s in (s for s in report["series"] if s["model"] == model):
            cs = [r["concurrency"] for r in s["results"]]
            style = "-" if s["protocol"] == "http" else "--"
            rps.plot(cs, [r["throughput_rps"] for r in s["results"]], style, marker="o", label=s["name"])
            p99.plot(cs, [r["p99_ms"] for r in s["results"]], style, marker="o", label=s["name"])
        limit = report["inprocess"].get(model, {}).get("by_concurrency", [])
        if limit:
            rps.plot([r["concurrency"] for r in limit], [r["throughput_rps"] for r in limit], ":", color="black",
                     label="in-process onnxruntime")
        rps.set_title(f"{model}: throughput (req/s)")
        p99.set_title(f"{model}: p99 latency (ms)")
        for ax in (rps, p99):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency (connections)")
            ax.grid(alpha=0.3)
        p99.set_yscale("log")
        rps.legend(fontsize=7)
    fig.suptitle("Classic path with low-cost clients: wrk (binary HTTP, solid) and h2load (gRPC, dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
