"""Running a batch on the event loop instead of the instance's thread, when that is cheaper.

Handing a batch to an instance's thread and its result back costs two thread wake-ups, which
on a small machine is 50-100 µs of CPU (measured: `loadtests/reports/classic.json`), far
more than a small ONNX model's whole execution (the digits MLP: about 10 µs). An instance
whose backend allows it (`Backend.inline_ok`) therefore runs a batch on the loop itself when
the time it is predicted to hold the loop is under `BUDGET_NS`:

- Only ONNX graphs whose work is fixed by their input shapes qualify (`bounded_onnx_graph`):
  no control flow, no op whose output size depends on input values, every shape argument a
  constant. With every input dimension fixed but the batch's, a batch's cost is then bounded
  by its rows, which the protocols already bound.
- The first `WARMUP` batches of an instance run on its thread and are timed; after that the
  gate predicts a batch's compute time from the time per row (the warm-up's median, so the
  first cold runs do not count, then an average that keeps learning from every batch, on
  either path) and runs on the loop only under budget.
- An execution on the loop that took `TRIP` times the budget (a loaded machine, a graph
  that misled the check) turns the instance's gate off for good, with a warning.

The thread path stays what enforces `execute_timeout_s`: nothing that can run long is run
on the loop.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("sluice.classic")
BUDGET_NS = 100_000
WARMUP = 16
TRIP = 20
_ALPHA = 0.1

# Ops whose work depends on input values, not shapes alone.
_UNBOUNDED_OPS = frozenset({"Loop", "If", "Scan", "SequenceMap", "NonZero", "NonMaxSuppression", "Unique",
                            "Compress", "StringSplit", "RegexFullMatch", "SplitToSequence", "ConcatFromSequence",
                            "SequenceConstruct", "SequenceInsert", "SequenceErase", "Optional"})
# Inputs that can make an output larger than the op's inputs: they must be constants (initializers,
# or computed from them and from shapes alone).
_SIZE_INPUTS = {"Expand": (1,), "Tile": (1,), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Upsample": (1,),
                "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1,), "CenterCropPad": (1,), "Col2Im": (1, 2),
                "DFT": (1, 2), "STFT": (1, 2, 3)}
_KNOWN_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")


def bounded_onnx_graph(path: Path) -> str | None:
    """None when the graph's work is fixed by its input shapes; else why it is not (or cannot be read)."""
    try:
        import onnx
    except ImportError:
        return "the onnx package is not installed"
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # a model onnxruntime loads but onnx cannot parse stays on its thread
        return f"onnx cannot read it ({type(exc).__name__})"
    static = {t.name for t in graph.initializer}
    for node in graph.node:
        if node.domain not in _KNOWN_DOMAINS:
            return f"op {node.domain}.{node.op_type}"
        if node.op_type in _UNBOUNDED_OPS:
            return f"op {node.op_type}"
        for i in _SIZE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] and node.input[i] not in static:
                return f"op {node.op_type} takes its size from a computed tensor ({node.input[i]})"
        if node.op_type in ("Constant", "Shape", "Size") or all(x in static for x in node.input if x):
            static.update(node.output)  # values fixed by constants and shapes alone
    return None


class InlineGate:
    """Per instance: whether its next batch of `rows` rows runs on the loop."""

    __slots__ = ("_allowed", "_name", "_per_row_ns", "_warmup")

    def __init__(self, allowed: bool, name: str) -> None:
        self._allowed, self._name = allowed, name
        self._warmup: list[float] | None = []  # None once warm
        self._per_row_ns = 0.0

    def wants(self, rows: int) -> bool:
        return self._allowed and self._warmup is None and self._per_row_ns * max(rows, 1) <= BUDGET_NS

    def observe(self, infer_ns: int, rows: int, inline: bool) -> None:
        """One execution's compute time (on either path)."""
        if not self._allowed:
            return
        per_row = infer_ns / max(rows, 1)
        if self._warmup is not None:
            self._warmup.append(per_row)
            if len(self._warmup) >= WARMUP:
                self._per_row_ns = sorted(self._warmup)[len(self._warmup) // 2]
                self._warmup = None
        else:
            self._per_row_ns += _ALPHA * (per_row - self._per_row_ns)
        if inline and infer_ns > TRIP * BUDGET_NS:
            self._allowed = False
            log.warning("model %s: an execution on the event loop took %.1f ms; its batches run on the instance's "
                        "thread from now on", self._name, infer_ns / 1e6)
