"""Builds the classic example models' artefacts (ONNX files) from data shipped in scikit-learn.

`build_all(repo_dir, cache_dir)` trains and exports once per BUILD_VERSION into
`cache_dir/classic/<BUILD_VERSION>/`, then links (or copies) the files into the
repository's version directories. A second run only checks and links: fast.
Configs and python model files are committed sources; only binaries are built.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

# Bump when training or export changes: the cache key.
BUILD_VERSION = "classic-v1"
_OPSET = {"": 17, "ai.onnx.ml": 3}


def build_all(repo_dir: Path, cache_dir: Path) -> None:
    """Idempotent: make sure every classic ONNX model exists under `repo_dir`."""
    repo_dir, cache_dir = Path(repo_dir), Path(cache_dir)
    out_dir = cache_dir / "classic" / BUILD_VERSION
    out_dir.mkdir(parents=True, exist_ok=True)
    builders: dict[str, Callable[[Path], None]] = {
        "digits_onnx": build_digits,
        "breast_cancer_gb": build_breast_cancer,
    }
    for name, builder in builders.items():
        cached = out_dir / f"{name}.onnx"
        if not cached.exists():
            tmp = cached.with_suffix(".tmp")
            builder(tmp)
            os.replace(tmp, cached)  # atomic: a concurrent or interrupted build never leaves half a file
        _install(cached, repo_dir / name / "1" / "model.onnx")
    install_ocr(repo_dir)
    # The CNN goes where the repository declares it (a test repository without it trains nothing).
    targets = {"digits_cnn": "model.onnx", "digits_cnn_pt": "model.pt"}
    wanted = {name: file for name, file in targets.items() if (repo_dir / name / "config.pbtxt").exists()}
    if wanted:
        built = cnn_artifacts(cache_dir)
        for name, file in wanted.items():
            _install(built[file], repo_dir / name / "1" / file)


# The OCR pipeline's networks, as the rapidocr-onnxruntime wheel ships them (requirements-models.txt).
OCR_MODELS = {"ocr_det": "ch_PP-OCRv4_det_infer.onnx", "ocr_cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "ocr_rec": "ch_PP-OCRv4_rec_infer.onnx"}


def install_ocr(repo_dir: Path) -> None:
    """Copy the OCR networks into the repository's ocr_* models that declare them."""
    wanted = {name: file for name, file in OCR_MODELS.items() if (repo_dir / name / "config.pbtxt").exists()}
    if not wanted:
        return
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        raise RuntimeError("the OCR models come from the rapidocr-onnxruntime wheel: run `make venv`")
    source = Path(spec.origin).parent / "models"
    for name, file in wanted.items():
        _install(source / file, repo_dir / name / "1" / "model.onnx")
    print(f"OCR models: {', '.join(sorted(wanted))} from {source}", flush=True)


def cnn_artifacts(cache_dir: Path) -> dict[str, Path]:
    """The CNN (`cnn_build.py`), trained once per CNN_VERSION under a lock so concurrent builds train once:
    {"model.onnx": path, "model.pt": path, "report": path}."""
    import fcntl
    import json

    from model_repository.cnn_build import CNN_VERSION

    out_dir = Path(cache_dir) / "classic" / CNN_VERSION
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "digits_cnn.json"
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = not report_path.exists()
        if built:
            from model_repository.cnn_build import build_cnn

            build_cnn(out_dir)
    report = json.loads(report_path.read_text())
    print(f"digits_cnn: test accuracy {report['test_accuracy']:.4f} on {report['test_images']} held-out images, "
          f"{report['mflops_per_image']} MFLOPs/image, " + (f"built in {report['build_s']} s" if built else "cached")
          + f" ({report_path})", flush=True)
    return {"model.onnx": out_dir / "digits_cnn.onnx", "model.pt": out_dir / "digits_cnn.pt", "report": report_path}


def _install(src: Path, dst: Path) -> None:
    if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.read_bytes() == src.read_bytes():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def digits_training_data() -> tuple:
    """Digits as float32 in [0, 1] (8x8 pixels flattened), the classifier's input convention."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target


def build_digits(path: Path) -> None:
    from sklearn.neural_network import MLPClassifier

    x, y = digits_training_data()
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=400, random_state=0).fit(x, y)
    _export(clf, 64, path)


def build_breast_cancer(path: Path) -> None:
    import numpy as np
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import GradientBoostingClassifier

    data = load_breast_cancer()
    clf = GradientBoostingClassifier(n_estimators=50, max_depth=3, random_state=0)
    clf.fit(data.data.astype(np.float32), data.target)
    _export(clf, 30, path)


def _export(clf: object, n_features: int, path: Path) -> None:
    """skl2onnx export with a dynamic batch dim; outputs 'label' [N,1] int64 and 'probabilities' [N,C]."""
    import onnx
    from onnx import TensorProto, helper
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    model = convert_sklearn(clf, initial_types=[("input", FloatTensorType([None, n_features]))],
                            options={id(clf): {"zipmap": False}}, target_opset=_OPSET)
    graph = model.graph
    # skl2onnx's label is [N]; Triton-style batching wants [N, 1], so append an Unsqueeze.
    label = next(o for o in graph.output if o.name == "label")
    for node in graph.node:
        node.output[:] = ["label_flat" if o == "label" else o for o in node.output]
    graph.initializer.append(helper.make_tensor("label_axes", TensorProto.INT64, [1], [1]))
    graph.node.append(helper.make_node("Unsqueeze", ["label_flat", "label_axes"], ["label"]))
    graph.output.remove(label)
    graph.output.insert(0, helper.make_tensor_value_info("label", TensorProto.INT64, [None, 1]))
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


if __name__ == "__main__":
    import sys

    cache = Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))
    build_all(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent), cache)
