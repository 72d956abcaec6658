"""Running a batch on the event loop instead of the instance's thread, when that is cheaper.

Handing a batch to an instance's thread and its result back costs two thread wake-ups, which
on a small machine is 50-100 µs of CPU (measured: `loadtests/reports/classic.json`), far
more than a small ONNX model's whole execution (the digits MLP: about 10 µs). An instance
whose backend allows it (`Backend.inline_ok`) therefore runs a batch on the loop itself when
the time it is predicted to hold the loop is under `BUDGET_NS`:

- Only ONNX graphs whose work is fixed by their input shapes qualify (`bounded_onnx_graph`):
  every op from an allowlist of ops whose output shapes follow from input shapes, and every
  size argument a constant (or, for ops that only shrink or rearrange, computed from shapes).
  With every input dimension fixed but the batch's, a batch's cost is then bounded by its
  rows, which the protocols already bound.
- The first `WARMUP` batches of an instance run on its thread and are timed (a batch's whole
  execute: stacking, compute, splitting); after that the gate predicts a batch's time from
  the measured average batch, scaled by rows, and runs on the loop only under budget.
- `TRIP_COUNT` of the last `TRIP_WINDOW` executions on the loop over `TRIP` times the budget
  (a loaded machine, a graph that misled the check) send the instance back to its thread for
  `COOL_OFF_S`, with a warning; then it is measured again.
- Only ONNX graphs of ops known to be bounded by shapes qualify (an allowlist), without
  string tensors (their cost is their bytes, not their rows).

The thread path stays what enforces `execute_timeout_s`: nothing that can run long is run
on the loop.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from pathlib import Path

log = logging.getLogger("sluice.classic")
BUDGET_NS = 100_000
WARMUP = 16
TRIP = 20  # an execution on the loop over TRIP x budget is slow; TRIP_COUNT slow in the last TRIP_WINDOW:
TRIP_COUNT, TRIP_WINDOW, COOL_OFF_S = 3, 16, 60.0  # back to the thread for COOL_OFF_S, then measured again
_ALPHA = 0.1

# Ops whose outputs' shapes follow from their inputs' shapes and their attributes alone (an allowlist:
# an op not named here keeps its graph on the thread). ZipMap and the tree, linear and SVM ops cost
# what their fixed parameters say per row.
_SHAPE_OPS = frozenset([
    "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh", "AveragePool",
    "BatchNormalization", "BitShift", "Cast", "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant", "Conv",
    "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "DequantizeLinear", "Div",
    "Dropout", "Einsum", "Elu", "Equal", "Erf", "Exp", "Flatten", "Floor", "Gather", "GatherElements",
    "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater",
    "GreaterOrEqual", "GroupNormalization", "HardSigmoid", "HardSwish", "Hardmax", "Identity",
    "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual",
    "Log", "LogSoftmax", "LpNormalization", "LpPool", "MatMul", "MatMulInteger", "Max", "MaxPool", "Mean",
    "MeanVarianceNormalization", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "PRelu", "Pow", "QLinearConv",
    "QLinearMatMul", "QuantizeLinear", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign",
    "Sin", "Sinh", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Sqrt", "Sub", "Sum", "Tan", "Tanh",
    "ThresholdedRelu", "Transpose", "Trilu", "Where", "Xor", "Shape", "Size", "ArrayFeatureExtractor",
    "Binarizer", "FeatureVectorizer", "Imputer", "LinearClassifier", "LinearRegressor", "Normalizer",
    "OneHotEncoder", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsemble", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap",
])
# Ops whose output size comes from the values of the inputs named (by position). Those that can only
# shrink or rearrange their input may take sizes computed from shapes (a flatten: Reshape(x, [Shape(x)[0],
# -1])); those that can grow it need constants.
_SHRINK_OPS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,),
               "TopK": (1,), **dict.fromkeys((
                   "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
                   "ReduceProd", "ReduceSum", "ReduceSumSquare"), (1,))}
_GROW_OPS = {"Expand": (1,), "Tile": (1,), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Upsample": (1,),
             "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1,)}
_SIZE_INPUTS = {**_SHRINK_OPS, **_GROW_OPS}
_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def bounded_onnx_graph(path: Path) -> str | None:
    """None when the graph's work is fixed by its input shapes; else why it is not (or cannot be read).
    Cached by file identity: every instance of a version asks."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot stat it ({exc.strerror})"
    return _bounded(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _bounded(path: str, _mtime_ns: int, _size: int) -> str | None:
    try:
        import onnx
    except ImportError:
        return "the onnx package is not installed"
    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception as exc:  # a model onnxruntime loads but onnx cannot parse stays on its thread
        return f"onnx cannot read it ({type(exc).__name__})"
    inputs = {i.name for i in graph.input}
    const = {t.name for t in graph.initializer} - inputs  # an initializer a caller may override is not constant
    from_shapes: set[str] = set()  # values computed from constants and tensors' shapes
    for node in graph.node:
        op = node.op_type
        if node.domain not in _DOMAINS:
            return f"op {node.domain}.{op}"
        if op not in _SHAPE_OPS and op not in _SIZE_INPUTS:
            return f"op {op} is not known to be bounded by its inputs' shapes"
        allowed = const if op in _GROW_OPS else const | from_shapes
        for i in _SIZE_INPUTS.get(op, ()):
            if i < len(node.input) and node.input[i] and node.input[i] not in allowed:
                return f"op {op} takes its size from a computed tensor ({node.input[i]})"
        args = [x for x in node.input if x]
        if op == "Constant" or (args and all(x in const for x in args)):
            const.update(node.output)
        elif op in ("Shape", "Size") or (args and all(x in const or x in from_shapes for x in args)):
            from_shapes.update(node.output)
    return None


class InlineGate:
    """Per instance: whether its next batch of `rows` rows runs on the loop.

    The prediction scales the average measured batch by rows (never below one average batch), so a
    fixed cost per call is not lost; times are a batch's whole execute (stacking, compute, splitting)."""

    __slots__ = ("_allowed", "_avg_ns", "_avg_rows", "_name", "_off_until", "_slow", "_warmup")

    def __init__(self, allowed: bool, name: str) -> None:
        self._allowed, self._name = allowed, name
        self._warmup: list[tuple[int, int]] | None = []  # None once warm
        self._avg_ns = self._avg_rows = 0.0
        self._slow: deque[bool] = deque(maxlen=TRIP_WINDOW)  # recent executions on the loop: over TRIP x budget?
        self._off_until = 0.0

    def wants(self, rows: int) -> bool:
        if not self._allowed or self._warmup is not None:
            return False
        if self._off_until:
            if time.monotonic() < self._off_until:
                return False
            self._off_until, self._warmup = 0.0, []  # measure again on the thread
            return False
        return self._avg_ns * max(1.0, rows / self._avg_rows) <= BUDGET_NS

    def observe(self, ns: int, rows: int, inline: bool) -> None:
        """One execution's time (on either path); a failed one, which reports no time, is not counted."""
        if not self._allowed or ns <= 0:
            return
        if self._warmup is not None:
            self._warmup.append((ns, max(rows, 1)))
            if len(self._warmup) >= WARMUP:  # the median: the first cold runs do not count
                self._avg_ns, self._avg_rows = sorted(self._warmup)[len(self._warmup) // 2]
                self._warmup = None
            return
        self._avg_ns += _ALPHA * (ns - self._avg_ns)
        self._avg_rows += _ALPHA * (max(rows, 1) - self._avg_rows)
        if inline:
            self._slow.append(ns > TRIP * BUDGET_NS)
            if sum(self._slow) >= TRIP_COUNT:
                self._slow.clear()
                self._off_until = time.monotonic() + COOL_OFF_S
                log.warning("model %s: %d of its last %d executions on the event loop took over %.0f ms; its "
                            "batches run on the instance's thread for %.0f s", self._name, TRIP_COUNT,
                            TRIP_WINDOW, TRIP * BUDGET_NS / 1e6, COOL_OFF_S)
