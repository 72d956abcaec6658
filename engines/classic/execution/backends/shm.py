"""Shared-memory segments carrying tensors between the server and a model process.

A `Segment` is an anonymous shared-memory file (Linux `memfd_create`; elsewhere a temporary
file unlinked at once) mapped into both processes. It has no name anywhere: /dev/shm lists
nothing, and a model process reaches only the segments its server hands it, as file
descriptors over its socket (`send`/`receive`, SCM_RIGHTS). The server creates, grows (by
replacing) and closes every segment; the memory goes with the last mapping, so a process
that dies leaks none, nor does a server that is killed.

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
import socket
import struct
import tempfile
from typing import Any, NamedTuple

import numpy as np

from engines.classic.dtypes import as_bytes_array, numpy_to_wire, wire_to_numpy

_ALIGN = 64
_LEN = struct.Struct("<I")
_MAX_FDS = 2  # per message: the input and the output segment


class Segment:
    """`fd` is an open shared-memory file of at least `size` bytes; the server's segment keeps it (to hand
    to a restarted process), the model process's closes it once mapped. `id` tells segments apart."""

    def __init__(self, fd: int, size: int, segment_id: str, keep_fd: bool) -> None:
        self.id = segment_id
        self.size = max(size, 1)
        try:
            self._mmap = mmap.mmap(fd, self.size)
        finally:
            if not keep_fd:
                os.close(fd)
        self.fd = fd if keep_fd else -1
        self.buf = memoryview(self._mmap)

    @classmethod
    def create(cls, size: int) -> Segment:
        fd = _anonymous_file()
        try:
            os.ftruncate(fd, max(size, 1))
            return cls(fd, size, secrets.token_hex(8), keep_fd=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int, description: dict[str, Any]) -> Segment:
        """Map a received segment (`describe()` of the server's); `fd` is closed."""
        return cls(fd, int(description["size"]), str(description["id"]), keep_fd=False)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "size": self.size}

    def close(self) -> None:
        """Unmap and close; a view a model still holds keeps the mapping alive until it is dropped."""
        self.buf.release()
        with contextlib.suppress(BufferError):
            self._mmap.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _anonymous_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("sluice-tensors", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="sluice-tensors-")
    os.unlink(path)
    return fd


def send(sock: socket.socket, segments: list[Segment]) -> None:
    """Hand `segments` to the peer (after the message that names them)."""
    socket.send_fds(sock, [b"F"], [s.fd for s in segments])


def receive(sock: socket.socket, count: int) -> list[int]:
    """The `count` file descriptors `send` handed over (close-on-exec); map each with `Segment.attach`."""
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
    data, fds, _, _ = socket.recv_fds(sock, 1, _MAX_FDS, flags)
    if data != b"F" or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"expected {count} shared-memory segments, got {len(fds)}")
    return fds


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
