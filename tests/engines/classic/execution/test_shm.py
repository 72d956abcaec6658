"""Tensors through shared-memory segments (what a model in its own process sends and receives)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from engines.classic.execution.backends import shm


@pytest.fixture()
def segment():
    seg = shm.Segment.create(4096)
    yield seg
    seg.close()


def test_round_trip_every_dtype_bit_for_bit(segment):
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "f64": np.array([np.nan, -0.0, np.inf]),
        "i64": np.array([[-(2**63), 2**63 - 1]]),
        "u8": np.arange(7, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), np.int32),
        "strided": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
        "bytes": np.array([[b"a", b""], [b"\0\xff", "\u00e9".encode()]], dtype=object),
    }
    tensors = shm.encode(arrays)
    metas, end = shm.pack(tensors, segment)
    assert end <= segment.size and shm.packed_size(tensors) == end
    assert all(m["offset"] % 64 == 0 for m in metas)
    views = shm.unpack(metas, segment, copy=False)
    copies = shm.unpack(metas, segment, copy=True)
    for name, array in arrays.items():
        for got in (views[name], copies[name]):
            assert got.shape == array.shape and got.dtype == array.dtype, name
            if array.dtype == object:
                assert got.tolist() == array.tolist()
            else:
                assert got.tobytes() == np.ascontiguousarray(array).tobytes(), name
    segment.buf[metas[0]["offset"]] = 0
    assert copies["f32"].tobytes() == arrays["f32"].tobytes()  # copies do not follow the segment


def test_metadata_outside_the_segment_is_refused(segment):
    good = {"name": "x", "dtype": "FP32", "shape": [2], "offset": 0, "nbytes": 8}
    for bad in ({"offset": 4090}, {"nbytes": 12}, {"offset": -8}, {"shape": [-2]}, {"dtype": "FP8"}):
        with pytest.raises(ValueError):
            shm.unpack([{**good, **bad}], segment, copy=True)
    segment.buf[0:4] = (1000).to_bytes(4, "little")
    with pytest.raises(ValueError, match="runs past"):
        shm.unpack([{"name": "s", "dtype": "BYTES", "shape": [1], "offset": 0, "nbytes": 8}], segment, copy=True)


def test_too_large_for_the_segment(segment):
    with pytest.raises(ValueError, match="does not fit"):
        shm.pack(shm.encode({"x": np.zeros(2048, np.float32)}), segment)


def test_segments_have_no_name_and_travel_as_descriptors():
    """Nothing in /dev/shm names a segment; a peer maps one only from the descriptor it was handed."""
    before = set(os.listdir("/dev/shm"))
    ours, theirs = socket.socketpair()
    seg = shm.Segment.create(4096)
    try:
        assert set(os.listdir("/dev/shm")) == before
        assert os.readlink(f"/proc/self/fd/{seg.fd}").startswith("/memfd:")
        seg.buf[:5] = b"hello"
        shm.send(ours, [seg])
        (fd,) = shm.receive(theirs, 1)
        peer = shm.Segment.attach(fd, seg.describe())
        assert bytes(peer.buf[:5]) == b"hello" and peer.id == seg.id and peer.fd == -1
        peer.buf[:5] = b"world"
        assert bytes(seg.buf[:5]) == b"world"
        peer.close()
        shm.send(ours, [seg])
        with pytest.raises(ValueError, match="expected 2 shared-memory segments, got 1"):
            shm.receive(theirs, 2)
    finally:
        seg.close()
        ours.close()
        theirs.close()
