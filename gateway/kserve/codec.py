"""Tensor (de)serialisation shared by KServe HTTP and gRPC: raw bytes, BYTES length prefixes, JSON data.

Pure functions; every malformed payload raises InferError(INVALID_ARG) with a
message that names the tensor.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from engines.classic.dtypes import as_bytes_array, element_size, numpy_to_wire, wire_to_numpy
from engines.classic.errors import invalid
from engines.classic.limits import element_count

_LENGTH = struct.Struct("<I")


def check_shape(name: str, shape: Any, max_elements: int) -> tuple[int, ...]:
    """The shape as a tuple, before anything is allocated for it: integers, none negative, and at most
    `max_elements` elements (counted without int64 overflow)."""
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in shape):
        raise invalid(f"input '{name}': shape must be a list of integers")
    element_count(name, shape, max_elements)
    return tuple(shape)


def wire_dtype(name: str, datatype: Any) -> np.dtype:
    try:
        return wire_to_numpy(str(datatype))
    except ValueError:
        raise invalid(f"input '{name}': unknown datatype '{datatype}'") from None


def from_raw(name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> np.ndarray:
    """Decode a raw little-endian buffer (or length-prefixed BYTES) into an array of `shape`.

    `shape` has passed `check_shape`; the buffer's size is checked against it before any conversion.
    """
    dtype = wire_dtype(name, datatype)
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_from_raw(name, shape, count, raw)
    expected = count * element_size(datatype)
    if len(raw) != expected:
        raise invalid(f"input '{name}': unexpected binary data size {len(raw)} bytes; shape {list(shape)} of "
                      f"{datatype} needs {expected} bytes")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<"), count=count).astype(dtype, copy=False).reshape(shape)


def _bytes_from_raw(name: str, shape: tuple[int, ...], count: int, raw: bytes | memoryview) -> np.ndarray:
    # Each element takes at least its 4-byte length, so a payload too short for the shape is refused
    # unread, and the loop runs at most `count` times whatever the payload's lengths say.
    view = memoryview(raw)
    if 4 * count > len(view):
        raise invalid(f"input '{name}': shape {list(shape)} needs {count} BYTES elements, at least {4 * count} "
                      f"bytes; got {len(view)}")
    out = np.empty(count, dtype=np.object_)
    offset = 0
    for i in range(count):
        if offset + 4 > len(view):
            raise invalid(f"input '{name}': truncated BYTES length prefix at offset {offset}")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise invalid(f"input '{name}': BYTES element of {length} bytes runs past the end of the data")
        out[i] = bytes(view[offset:offset + length])
        offset += length
    if offset != len(view):
        raise invalid(f"input '{name}': {len(view) - offset} bytes of BYTES data follow the {count} elements "
                      f"shape {list(shape)} needs")
    return out.reshape(shape)


def to_raw(array: np.ndarray) -> bytes:
    """Serialise an output array: little-endian values, or 4-byte length prefixes for BYTES."""
    if numpy_to_wire(array.dtype) == "BYTES":
        return b"".join(_LENGTH.pack(len(item)) + item for item in as_bytes_array(array).flat)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()


def from_json_data(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """Decode JSON `data` (flat or nested, row-major) into an array of `shape` (checked by `check_shape`)."""
    dtype = wire_dtype(name, datatype)
    count = math.prod(shape)
    flat = _flatten(name, data)
    if len(flat) != count:
        raise invalid(f"input '{name}': got {len(flat)} elements, shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        out = np.empty(count, dtype=np.object_)
        for i, item in enumerate(flat):
            if not isinstance(item, (str, bytes)):
                raise invalid(f"input '{name}': BYTES data must be strings")
            out[i] = item.encode("utf-8") if isinstance(item, str) else item
        return out.reshape(shape)
    try:
        if datatype == "BOOL":
            if not all(isinstance(v, bool) for v in flat):
                raise TypeError("BOOL data must be true/false")
        elif any(isinstance(v, (bool, str)) or v is None for v in flat):
            raise TypeError(f"{datatype} data must be numbers")
        array = np.array(flat, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise invalid(f"input '{name}': cannot convert data to {datatype}: {exc}") from None
    return array.reshape(shape)


def _flatten(name: str, data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise invalid(f"input '{name}': 'data' must be a JSON array")
    out: list[Any] = []
    stack = [iter(data)]
    depth_lengths: dict[int, int] = {}
    # Nested arrays must be regular (not ragged): same length at each depth.
    while stack:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        if isinstance(item, list):
            depth = len(stack)
            if depth_lengths.setdefault(depth, len(item)) != len(item):
                raise invalid(f"input '{name}': ragged nested data is not allowed")
            stack.append(iter(item))
        else:
            out.append(item)
    return out


_END = object()


def to_json_data(array: np.ndarray) -> list[Any]:
    """Flattened row-major data for a JSON response (BYTES as UTF-8 strings, lossy for binary)."""
    if numpy_to_wire(array.dtype) == "BYTES":
        return [b.decode("utf-8", errors="replace") for b in as_bytes_array(array).flat]
    return array.reshape(-1).tolist()
