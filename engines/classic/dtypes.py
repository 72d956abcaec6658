"""Triton data types <-> numpy dtypes, for both config names (TYPE_FP32) and wire names (FP32)."""

from __future__ import annotations

import numpy as np

# Wire name -> numpy dtype. BYTES are numpy object arrays holding `bytes`.
_WIRE_TO_NP: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_NP_TO_WIRE = {v: k for k, v in _WIRE_TO_NP.items()}

WIRE_TYPES = frozenset(_WIRE_TO_NP)


def wire_to_numpy(wire: str) -> np.dtype:
    """'FP32' -> float32. Raises ValueError for an unknown name."""
    try:
        return _WIRE_TO_NP[wire]
    except KeyError:
        raise ValueError(f"unknown data type '{wire}'") from None


def numpy_to_wire(dtype: np.dtype) -> str:
    """float32 -> 'FP32'; any string/bytes/object dtype -> 'BYTES'."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return _NP_TO_WIRE[dtype]
    except KeyError:
        raise ValueError(f"unsupported numpy dtype {dtype}") from None


def config_to_wire(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def element_size(wire: str) -> int:
    """Bytes per element for fixed-size types; 0 for BYTES."""
    return 0 if wire == "BYTES" else _WIRE_TO_NP[wire].itemsize


def as_bytes_array(array: np.ndarray) -> np.ndarray:
    """Normalise a str/bytes/object array to an object array of `bytes` (Triton's BYTES)."""
    if array.dtype == np.object_ and all(isinstance(x, bytes) for x in array.flat):
        return array
    out = np.empty(array.shape, dtype=np.object_)
    for idx, item in np.ndenumerate(array):
        out[idx] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out
