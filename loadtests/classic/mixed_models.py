"""The mixed box's models beside the image classifier and the OCR pipeline (bench_mixed_box.py):

- `fraud_gb`: gradient boosting on an imbalanced set (scikit-learn's make_classification, 2 % positives,
  30 features), exported with skl2onnx: `input` FP32 [-1, 30] -> `label`, `probabilities` [-1, 2].
- `recommender`: matrix factorisation (ALS on synthetic implicit feedback: 2,000 users, 5,000 items,
  32 factors), exported as an ONNX graph that scores every item for a user and keeps the top 10:
  `user` INT64 [-1, 1] -> `items` INT64 [-1, 10], `scores` FP32 [-1, 10].

Each is written with its config.pbtxt (dynamic batching; `rate_limiter` added by the benchmark).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

USERS, ITEMS, FACTORS, TOP = 2000, 5000, 32, 10


def build_fraud(repo: Path) -> np.ndarray:
    """fraud_gb in `repo`; returns some of its held-out rows (float32) for the load."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier

    from model_repository.classic_build import _export

    x, y = make_classification(n_samples=20000, n_features=30, n_informative=12, weights=[0.98], random_state=0)
    x = x.astype(np.float32)
    clf = GradientBoostingClassifier(n_estimators=100, max_depth=3, random_state=0).fit(x[:16000], y[:16000])
    (repo / "fraud_gb" / "1").mkdir(parents=True, exist_ok=True)
    _export(clf, 30, repo / "fraud_gb" / "1" / "model.onnx")
    (repo / "fraud_gb" / "config.pbtxt").write_text('''name: "fraud_gb"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "input", data_type: TYPE_FP32, dims: [ 30 ] } ]
output [ { name: "label", data_type: TYPE_INT64, dims: [ 1 ] },
         { name: "probabilities", data_type: TYPE_FP32, dims: [ 2 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
''')
    return x[16000:16256]


def _factors(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A few rounds of ALS on synthetic implicit feedback (users like items of their own taste cluster)."""
    rng = np.random.default_rng(seed)
    taste_u, taste_i = rng.integers(0, 20, USERS), rng.integers(0, 20, ITEMS)
    liked = (taste_u[:, None] == taste_i[None, :]) & (rng.random((USERS, ITEMS)) < 0.05)
    r = liked.astype(np.float32)
    u = rng.normal(0, 0.1, (USERS, FACTORS)).astype(np.float32)
    v = rng.normal(0, 0.1, (ITEMS, FACTORS)).astype(np.float32)
    reg = 0.1 * np.eye(FACTORS, dtype=np.float32)
    for _ in range(6):
        u = np.linalg.solve(v.T @ v + reg, v.T @ r.T).T.astype(np.float32)
        v = np.linalg.solve(u.T @ u + reg, u.T @ r).T.astype(np.float32)
    return u, v


def build_recommender(repo: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    u, v = _factors()
    graph = helper.make_graph(
        [helper.make_node("Squeeze", ["user", "axis1"], ["user_flat"]),
         helper.make_node("Gather", ["U", "user_flat"], ["user_vec"], axis=0),
         helper.make_node("MatMul", ["user_vec", "VT"], ["all_scores"]),
         helper.make_node("TopK", ["all_scores", "k"], ["scores", "items"], axis=1)],
        "recommender",
        [helper.make_tensor_value_info("user", TensorProto.INT64, [None, 1])],
        [helper.make_tensor_value_info("items", TensorProto.INT64, [None, TOP]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, TOP])],
        [numpy_helper.from_array(u, "U"), numpy_helper.from_array(np.ascontiguousarray(v.T), "VT"),
         numpy_helper.from_array(np.array([TOP], np.int64), "k"), numpy_helper.from_array(np.array([1], np.int64),
                                                                                          "axis1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    (repo / "recommender" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, repo / "recommender" / "1" / "model.onnx")
    (repo / "recommender" / "config.pbtxt").write_text('''name: "recommender"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "user", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [ { name: "items", data_type: TYPE_INT64, dims: [ 10 ] },
         { name: "scores", data_type: TYPE_FP32, dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
''')
