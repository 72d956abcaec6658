"""Triton's own gRPC client (tritonclient.grpc) against Sluice's KServe v2 gRPC server: the
model config, the digits ensemble on scikit-learn digits, its classifier step alone, and an
asynchronous call.

    python examples/triton_grpc.py [--grpc-url 127.0.0.1:8001] [--count 16]

Also SLUICE_GRPC_URL, and SLUICE_API_KEY when the gateway has API keys (sent as
`authorization` metadata).
"""

from __future__ import annotations

import argparse
import os
import queue

import numpy as np
import tritonclient.grpc as grpcclient
from sklearn.datasets import load_digits

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def main() -> None:
    p = argparse.ArgumentParser(description="The digits models over KServe v2 gRPC with tritonclient.")
    p.add_argument("--grpc-url", default=os.environ.get("SLUICE_GRPC_URL", "127.0.0.1:8001"))
    p.add_argument("--count", type=int, default=16, help="how many digits to classify")
    args = p.parse_args()
    key = os.environ.get("SLUICE_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else None
    client = grpcclient.InferenceServerClient(args.grpc_url)

    print("server live:", client.is_server_live(headers=headers), "ready:", client.is_server_ready(headers=headers))
    config = client.get_model_config("digits_ensemble", headers=headers, as_json=True)["config"]
    steps = [s["model_name"] for s in config["ensemble_scheduling"]["step"]]
    print("digits_ensemble steps:", " -> ".join(steps))

    digits = load_digits()
    images = np.rint(digits.images[: args.count] * 255 / 16).astype(np.uint8)  # 0..255, ink high
    image = grpcclient.InferInput("IMAGE", list(images.shape), "UINT8")
    image.set_data_from_numpy(images)
    result = client.infer("digits_ensemble", [image], headers=headers)
    labels = [b.decode() for b in result.as_numpy("LABEL").reshape(-1)]
    for i, (label, score) in enumerate(zip(labels, result.as_numpy("SCORE").reshape(-1), strict=True)):
        print(f"digit {i}: true={NAMES[digits.target[i]]} predicted={label} score={score:.3f}")
    correct = sum(label == NAMES[t] for label, t in zip(labels, digits.target[: args.count], strict=True))
    print(f"ensemble correct: {correct}/{args.count}")

    pixels = grpcclient.InferInput("input", [args.count, 64], "FP32")
    pixels.set_data_from_numpy((images.reshape(-1, 64) / 255).astype(np.float32))
    probs = client.infer("digits_onnx", [pixels], headers=headers).as_numpy("probabilities")
    print("digits_onnx agrees with the ensemble:", [NAMES[k] for k in probs.argmax(axis=1)] == labels)

    # async_infer calls back on a gRPC thread, as callback(result=..., error=...) (by those
    # names); a queue hands the result to this thread.
    done: queue.Queue[tuple[object, object]] = queue.Queue()
    one = grpcclient.InferInput("IMAGE", [1, 8, 8], "UINT8")
    one.set_data_from_numpy(images[:1])
    client.async_infer("digits_ensemble", [one], headers=headers,
                       callback=lambda result, error: done.put((result, error)))
    async_result, error = done.get(timeout=30)
    if error is not None:
        raise SystemExit(f"async_infer failed: {error}")
    print("async digit 0:", async_result.as_numpy("LABEL").reshape(-1)[0].decode())  # type: ignore[attr-defined]
    client.close()


if __name__ == "__main__":
    main()
