"""Every shipped classic model answers a row the same, bit for bit, alone or inside a dynamic batch.

The shipped configs are copied with a long batching window, so requests sent together are certain to
share an execution (checked from the model's own statistics); each row is then sent again alone.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from engines.classic import ModelRepositoryManager
from tests.integration.kserve_support import CACHE, REPO_SRC

ROWS = 6
WINDOW = f"dynamic_batching {{ max_queue_delay_microseconds: 150000 preferred_batch_size: [ {ROWS} ] }}"
# The ensemble batches in its steps; the LLM is not a classic model.
MODELS = ("digits_onnx", "breast_cancer_gb", "digits_cnn", "digits_cnn_pt", "digits_preprocess",
          "digits_postprocess", "all-minilm-l6-v2")


def _rows() -> dict[str, list[dict[str, np.ndarray]]]:
    from sklearn.datasets import load_breast_cancer, load_digits

    from model_repository.cnn_build import digits_32

    digits = load_digits()
    pixels = (digits.data[:ROWS] / 16.0).astype(np.float32)
    images = digits.images[:ROWS].astype(np.uint8) * 15
    probs = np.random.default_rng(0).dirichlet(np.ones(10), ROWS).astype(np.float32)
    cnn = digits_32()[0][:ROWS]
    texts = [b"three", b"seven", b"the quick brown fox", b"eight", b"\xc3\xa9t\xc3\xa9", b"zero " * 40]
    one = {
        "digits_onnx": lambda i: {"input": pixels[i:i + 1]},
        "breast_cancer_gb": lambda i: {"input": load_breast_cancer().data[i:i + 1].astype(np.float32)},
        "digits_cnn": lambda i: {"image": np.ascontiguousarray(cnn[i:i + 1])},
        "digits_cnn_pt": lambda i: {"image": np.ascontiguousarray(cnn[i:i + 1])},
        "digits_preprocess": lambda i: {"IMAGE": images[i:i + 1]},
        "digits_postprocess": lambda i: {"PROBABILITIES": probs[i:i + 1]},
        "digits_ensemble": lambda i: {"IMAGE": images[i:i + 1]},
        "all-minilm-l6-v2": lambda i: {"TEXT": np.array([[texts[i]]], dtype=object)},
    }
    return {name: [make(i) for i in range(ROWS)] for name, make in one.items()}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from model_repository.classic_build import build_all

    root = tmp_path_factory.mktemp("bits") / "repo"
    for name in (*MODELS, "digits_ensemble"):
        shutil.copytree(REPO_SRC / name, root / name, ignore=shutil.ignore_patterns("*.onnx", "*.pt", "__pycache__"))
        if name in MODELS:
            config = root / name / "config.pbtxt"
            text = re.sub(r"dynamic_batching\s*\{[^}]*\}", "", config.read_text())
            config.write_text(text + "\n" + WINDOW + "\n")
    build_all(root, CACHE)
    return root


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype == object:
            if x.tolist() != y.tolist():
                return False
        elif x.tobytes() != y.tobytes():
            return False
    return True


async def test_batched_rows_equal_rows_run_alone(repo: Path) -> None:
    m = ModelRepositoryManager(repo)
    await m.start()
    try:
        for name, rows in _rows().items():
            if name == "all-minilm-l6-v2" and m.repository_index() and not _ready(m, name):
                pytest.skip(f"{name} did not load here: {_reason(m, name)}")
            before = m.statistics(name)[0].execution_count
            together = await asyncio.gather(*(m.infer(name, "", r) for r in rows))
            executions = m.statistics(name)[0].execution_count - before
            alone = [await m.infer(name, "", r) for r in rows]
            if name != "digits_ensemble":  # its steps batch; it has no executions of its own to count
                assert executions < ROWS, f"{name}: the rows did not share an execution"
            for i, (b, a) in enumerate(zip(together, alone, strict=True)):
                assert _same(b, a), f"{name}: row {i} differs batched vs alone"
    finally:
        await m.stop()


def _ready(m: ModelRepositoryManager, name: str) -> bool:
    return any(r["name"] == name and r["state"] == "READY" for r in m.repository_index())


def _reason(m: ModelRepositoryManager, name: str) -> str:
    return next((r["reason"] for r in m.repository_index() if r["name"] == name), "not in the index")
