"""Triton's own HTTP client (tritonclient.http) against Sluice's KServe v2 routes: server and
model metadata, the digits ensemble on scikit-learn digits (binary tensors), its classifier
step alone (JSON tensors), and the statistics.

    python examples/triton_http.py [--url http://127.0.0.1:8000] [--count 16]

Also SLUICE_URL, and SLUICE_API_KEY when the gateway has API keys.
"""

from __future__ import annotations

import argparse
import os
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as httpclient
from sklearn.datasets import load_digits


def main() -> None:
    p = argparse.ArgumentParser(description="The digits models over KServe v2 HTTP with tritonclient.")
    p.add_argument("--url", default=os.environ.get("SLUICE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--count", type=int, default=16, help="how many digits to classify")
    args = p.parse_args()
    key = os.environ.get("SLUICE_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else None
    client = httpclient.InferenceServerClient(urlsplit(args.url).netloc)  # host:port, no scheme

    print("server live:", client.is_server_live(headers=headers), "ready:", client.is_server_ready(headers=headers))
    meta = client.get_model_metadata("digits_ensemble", headers=headers)
    print("digits_ensemble inputs:", [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]])
    print("digits_ensemble outputs:", [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]])

    digits = load_digits()
    # scikit-learn's digits are 0..16 with the ink high; the ensemble's IMAGE is the same at 0..255.
    images = np.rint(digits.images[: args.count] * 255 / 16).astype(np.uint8)
    image = httpclient.InferInput("IMAGE", list(images.shape), "UINT8")
    image.set_data_from_numpy(images, binary_data=True)
    result = client.infer("digits_ensemble", [image], headers=headers, outputs=[
        httpclient.InferRequestedOutput("LABEL", binary_data=True),
        httpclient.InferRequestedOutput("SCORE", binary_data=True)])
    labels = [b.decode() for b in result.as_numpy("LABEL").reshape(-1)]
    scores = result.as_numpy("SCORE").reshape(-1)
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    for i, (label, score) in enumerate(zip(labels, scores, strict=True)):
        print(f"digit {i}: true={names[digits.target[i]]} predicted={label} score={score:.3f}")
    correct = sum(label == names[t] for label, t in zip(labels, digits.target[: args.count], strict=True))
    print(f"ensemble correct: {correct}/{args.count}")

    # The classifier step alone, with JSON tensors: its input is the pixels / 255, as the
    # ensemble's preprocess step makes it.
    pixels = httpclient.InferInput("input", [args.count, 64], "FP32")
    pixels.set_data_from_numpy((images.reshape(-1, 64) / 255).astype(np.float32), binary_data=False)
    probs = client.infer("digits_onnx", [pixels], headers=headers, outputs=[
        httpclient.InferRequestedOutput("probabilities", binary_data=False)]).as_numpy("probabilities")
    agrees = [names[k] for k in probs.argmax(axis=1)] == labels
    print("digits_onnx agrees with the ensemble:", agrees)

    stats = client.get_inference_statistics("digits_ensemble", headers=headers)["model_stats"][0]
    print("digits_ensemble inferences:", stats["inference_count"])


if __name__ == "__main__":
    main()
