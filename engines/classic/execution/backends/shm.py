"""Shared-memory segments carrying tensors between the server and a model process.

A `Segment` is a POSIX shared-memory object (a file in /dev/shm) mapped into both
processes. The server creates, grows (by replacing) and unlinks every segment, so a
model process that dies leaks none; the model process only maps them by name.

`pack` lays arrays out at 64-byte aligned offsets and returns their metadata, plain
JSON: `{"name", "dtype" (wire name), "shape", "offset", "nbytes"}`. `unpack` reads
them back as numpy arrays: views into the mapping (the model process: no
copy) or copies (the server: no array outlives a segment it may replace). BYTES
elements are laid out as in KServe's binary extension, a 4-byte little-endian
length before each element's bytes. `unpack` checks every offset and size against
the segment, so a confused peer gets an error, never a read outside the mapping.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import secrets
import struct
from typing import Any, NamedTuple

import numpy as np

from engines.classic.dtypes import as_bytes_array, numpy_to_wire, wire_to_numpy

SHM_DIR = "/dev/shm"
_ALIGN = 64
_LEN = struct.Struct("<I")


class Segment:
    def __init__(self, name: str, size: int, create: bool) -> None:
        if "/" in name or not name:
            raise ValueError(f"bad shared-memory segment name {name!r}")
        self.name = name
        self.size = max(size, 1)
        self.path = os.path.join(SHM_DIR, name)
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, self.size)
            self._mmap = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    @classmethod
    def create(cls, prefix: str, size: int) -> Segment:
        return cls(f"{prefix}-{secrets.token_hex(6)}", size, create=True)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size}

    def close(self) -> None:
        """Unmap; a view a model still holds keeps the mapping alive until it is dropped."""
        self.buf.release()
        with contextlib.suppress(BufferError):
            self._mmap.close()

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def sweep_stale(prefix: str = "sluice-") -> list[str]:
    """Unlink segments `<prefix><pid>-...` whose creating server process is gone (one that was killed
    cannot unlink its own); returns their names. A live process's segments are left alone."""
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return removed
    for name in names:
        pid_text = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Encoded(NamedTuple):
    name: str
    dtype: str  # wire name
    shape: list[int]
    raw: memoryview  # the bytes as laid out in a segment


def encode(arrays: dict[str, np.ndarray]) -> list[Encoded]:
    out = []
    for name, array in arrays.items():
        wire = numpy_to_wire(array.dtype)
        if wire == "BYTES":
            raw = memoryview(b"".join(_LEN.pack(len(item)) + item for item in as_bytes_array(array).flat))
        else:
            raw = np.ascontiguousarray(array).reshape(-1).data.cast("B")
        out.append(Encoded(name, wire, list(array.shape), raw))
    return out


def packed_size(tensors: list[Encoded]) -> int:
    return sum(_aligned(t.raw.nbytes) for t in tensors)


def pack(tensors: list[Encoded], segment: Segment, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Write `tensors` into `segment` from `offset`; returns their metadata and the next free offset."""
    metas = []
    for t in tensors:
        if offset + t.raw.nbytes > segment.size:
            raise ValueError(f"tensor '{t.name}' does not fit the shared-memory segment")
        segment.buf[offset:offset + t.raw.nbytes] = t.raw
        metas.append({"name": t.name, "dtype": t.dtype, "shape": t.shape, "offset": offset, "nbytes": t.raw.nbytes})
        offset = _aligned(offset + t.raw.nbytes)
    return metas, offset


def unpack(metas: list[dict[str, Any]], segment: Segment, copy: bool) -> dict[str, np.ndarray]:
    """Arrays described by `metas`; raises ValueError for metadata that does not fit the segment."""
    out: dict[str, np.ndarray] = {}
    for meta in metas:
        name, wire, shape = str(meta["name"]), str(meta["dtype"]), tuple(int(d) for d in meta["shape"])
        offset, nbytes = int(meta["offset"]), int(meta["nbytes"])
        if min(offset, nbytes, *shape, 0) < 0 or offset + nbytes > segment.size:
            raise ValueError(f"tensor '{name}': offset {offset} + {nbytes} bytes is outside the segment")
        raw = segment.buf[offset:offset + nbytes]
        count = math.prod(shape)
        if wire == "BYTES":
            out[name] = _bytes(name, raw, count).reshape(shape)
            continue
        dtype = wire_to_numpy(wire)
        if count * dtype.itemsize != nbytes:
            raise ValueError(f"tensor '{name}': {nbytes} bytes for shape {list(shape)} of {wire}")
        array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
        out[name] = array.copy() if copy else array
    return out


def _bytes(name: str, raw: memoryview, count: int) -> np.ndarray:
    out = np.empty(count, dtype=np.object_)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise ValueError(f"tensor '{name}': BYTES element {i} is truncated")
        (length,) = _LEN.unpack_from(raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ValueError(f"tensor '{name}': BYTES element {i} runs past its data")
        out[i] = bytes(raw[offset:offset + length])
        offset += length
    return out
