"""Per-key quotas shared by the frontends of `sluice serve --frontends N` on one node, without Redis.

The `LocalQuotas` operations (`gateway.security.quota_buckets`) on one table that every frontend
maps into its memory: a file in the supervisor's private directory (mode 0700). An operation takes
an exclusive `flock` on the file for the microseconds it reads and writes one row, so admissions
in different frontends are atomic with respect to each other. No process holds the counters for
the others, so none can take them down when it dies: the kernel drops a dead process's lock.

A row per key id, found by a 16-byte digest of it (open addressing, `ROWS` rows): the rpm and tpm
buckets' tat, on CLOCK_MONOTONIC (one clock for every process of the node), and per frontend the
concurrency slots it holds. A frontend clears its own slots when it starts, so one that died and
was restarted frees what its dead requests held; until then they stay counted. Each frontend
also rewrites its own slots from the leases it holds every `lease_ttl_ms / 3` (`renew`, which its
`QuotaService` calls even with none, and at once when the table answers again), so a release
that never reached the table (it was away, or the release failed) is corrected within a second.
A release the table already got is not applied twice: the table counts the lease ids it holds.

A key id that finds the table full (more than `ROWS` of them) raises `KeyNotShared`: that key,
and only it, is enforced in each frontend alone. A lock not had within `LOCK_WAIT_S` (a frontend
stopped while it held it) raises TimeoutError, and a table that cannot be opened OSError:
`QuotaService` then enforces the limits in this frontend alone (open, never closed: N frontends
may then let a key use N times them), logs it, counts `sluice_quota_node_fallbacks_total`, sets
`sluice_quota_local` and `/health` says so, and shares again once the table answers.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from gateway.security.keys import Limits
from gateway.security.quota_buckets import CONCURRENCY_RETRY_S, KeyNotShared, Refusal, charge, check

ROWS = 4096  # key ids with a quota; more than that are enforced per frontend (KeyNotShared)
LOCK_WAIT_S = 0.05
_MAGIC = b"sluice-quotas-1\0"
_HEADER = struct.Struct("<16sii")  # magic, frontends, rows
_TATS = struct.Struct("<dd")  # rpm, tpm
_DIGEST = 16


class NodeQuotaStore:
    """A `QuotaStore` on the frontends' shared table. A call awaits only while another frontend holds the
    lock (the loop serves the rest meanwhile); the lock is never held across an await."""

    label = "the frontends' quota table"
    lease_ttl_ms = 3_000  # nothing expires: every third of this, `renew` rewrites this frontend's slots
    renews_idle = True  # `renew` with no leases clears what this frontend still counts

    def __init__(self, path: Path, index: int, count: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.index, self.count = path, index, count
        self._clock = clock
        self._slots = struct.Struct(f"<{count}i")
        self._row_bytes = -(-(_DIGEST + _TATS.size + self._slots.size) // 8) * 8
        self._size = _HEADER.size + ROWS * self._row_bytes
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._rows: dict[str, int] = {}  # key id -> its row's offset
        self._held: dict[str, str] = {}  # lease id -> key id: the slots this frontend holds in the table
        self._cleared = False  # this frontend's slots of an earlier run cleared

    # -- QuotaStore --------------------------------------------------------------
    async def admit(self, key_id: str, limits: Limits, lease_id: str | None, *, count: bool) -> Refusal | None:
        hold = bool(lease_id) and limits.concurrency > 0
        async with self._locked() as m:
            row = self._row(m, key_id)
            slots = self._slots.unpack_from(m, row + _DIGEST + _TATS.size)
            if hold and sum(slots) >= limits.concurrency:
                return Refusal("concurrency", CONCURRENCY_RETRY_S)
            if count and limits.rpm:
                now = self._clock()
                new, wait = check(_TATS.unpack_from(m, row + _DIGEST)[0], now, 1, limits.rpm)
                if new is None:
                    return Refusal("rpm", wait)
                struct.pack_into("<d", m, row + _DIGEST, new)
            if hold and lease_id:
                self._held[lease_id] = key_id
                self._add_slot(m, row, slots, 1)
        return None

    async def release(self, key_id: str, lease_id: str) -> None:
        async with self._locked() as m:
            if self._held.pop(lease_id, None) is None:
                return  # not counted here (admitted before a rewrite that already left it out)
            row = self._row(m, key_id)
            self._add_slot(m, row, self._slots.unpack_from(m, row + _DIGEST + _TATS.size), -1)

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        """`leases` are all the (key id, lease id) this frontend holds: its slots become exactly them."""
        async with self._locked() as m:
            if not self._cleared:
                self._clear(m)
            held = {lease_id: key_id for key_id, lease_id in leases}
            counts: dict[str, int] = {}
            for key_id in held.values():
                counts[key_id] = counts.get(key_id, 0) + 1
            for key_id in counts.keys() - self._rows.keys():
                try:
                    self._row(m, key_id)
                except KeyNotShared:  # never admitted here, so it holds no slot
                    counts.pop(key_id)
            for key_id, row in self._rows.items():
                self._set_slot(m, row, counts.get(key_id, 0))
            self._held = {lease_id: key_id for lease_id, key_id in held.items() if key_id in counts}

    async def reserve_tokens(self, key_id: str, tpm: int, tokens: int) -> Refusal | None:
        async with self._locked() as m:
            at = self._row(m, key_id) + _DIGEST + 8
            new, wait = check(struct.unpack_from("<d", m, at)[0], self._clock(), tokens, tpm)
            if new is None:
                return Refusal("tpm", wait)
            struct.pack_into("<d", m, at, new)
        return None

    async def charge_tokens(self, key_id: str, tpm: int, tokens: int) -> None:
        async with self._locked() as m:
            at = self._row(m, key_id) + _DIGEST + 8
            struct.pack_into("<d", m, at, charge(struct.unpack_from("<d", m, at)[0], self._clock(), tokens, tpm))

    async def ping(self) -> None:
        async with self._locked():
            pass

    async def check(self) -> None:
        """Open the table (the first frontend creates it) and clear this frontend's slots."""
        async with self._locked() as m:
            self._clear(m)

    def _clear(self, m: mmap.mmap) -> None:
        for row in range(_HEADER.size, self._size, self._row_bytes):
            self._set_slot(m, row, 0)
        self._held.clear()
        self._cleared = True

    async def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the table ---------------------------------------------------------------
    @asynccontextmanager
    async def _locked(self) -> AsyncIterator[mmap.mmap]:
        fd = self._open_fd()
        deadline = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                deadline = deadline or now + LOCK_WAIT_S
                if now > deadline:
                    raise TimeoutError(f"another frontend held the lock of {self.path} for over "
                                       f"{LOCK_WAIT_S * 1000:.0f} ms") from None
                await asyncio.sleep(0.0002)  # the loop serves everything else meanwhile
        try:
            yield self._mapped(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _open_fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return self._fd

    def _mapped(self, fd: int) -> mmap.mmap:
        """The table, created by the first frontend to lock it (the lock is held)."""
        if self._map is not None:
            return self._map
        size = os.fstat(fd).st_size
        if size == 0:
            os.ftruncate(fd, self._size)
            os.pwrite(fd, _HEADER.pack(_MAGIC, self.count, ROWS), 0)
        elif size != self._size or os.pread(fd, _HEADER.size, 0) != _HEADER.pack(_MAGIC, self.count, ROWS):
            raise OSError(f"{self.path} is not a quota table of {self.count} frontends")
        self._map = mmap.mmap(fd, self._size)
        return self._map

    def _row(self, m: mmap.mmap, key_id: str) -> int:
        """The offset of `key_id`'s row, claiming an empty one the first time (the lock is held)."""
        row = self._rows.get(key_id)
        if row is not None:
            return row
        digest = hashlib.blake2b(key_id.encode("utf-8"), digest_size=_DIGEST).digest()
        start = int.from_bytes(digest[:8], "little") % ROWS
        for k in range(ROWS):
            row = _HEADER.size + (start + k) % ROWS * self._row_bytes
            found = m[row:row + _DIGEST]
            if found == bytes(_DIGEST):
                m[row:row + _DIGEST] = digest
            if found in (digest, bytes(_DIGEST)):
                self._rows[key_id] = row
                return row
        raise KeyNotShared(f"{self.path} is full ({ROWS} key ids)")

    def _add_slot(self, m: mmap.mmap, row: int, slots: tuple[int, ...], delta: int) -> None:
        self._set_slot(m, row, max(0, slots[self.index] + delta))

    def _set_slot(self, m: mmap.mmap, row: int, value: int) -> None:
        struct.pack_into("<i", m, row + _DIGEST + _TATS.size + 4 * self.index, value)
