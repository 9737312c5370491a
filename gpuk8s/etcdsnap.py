"""An etcd snapshot, checked on the admin machine without etcd's tools: the SHA-256 that etcd
appends to every snapshot it streams, then a read-only walk of the bbolt file for what
``etcdutl snapshot status`` reports (revision, total keys, total size).

Formats relied on (each checked against a snapshot the real etcd 3.5.30 wrote,
tests/fixtures/real/etcd-3.5.30/):
- the trailer: server/etcdserver/api/v3rpc/maintenance.go@v3.5.30 (Snapshot: the db, then
  ``sha256.Sum`` of it as the last chunk); etcdutl/snapshot/v3_snapshot.go@v3.5.30 (restore:
  ``hasChecksum := size % 512 == sha256.Size``, the db being whole pages of 512-byte multiples);
- the status: etcdutl/snapshot/v3_snapshot.go@v3.5.30 (Status: every bucket's keys counted,
  the revision the main part of the "key" bucket's last key, the size ``tx.Size()``);
- bbolt's layout: go.etcd.io/bbolt@v1.3.11 page.go (16-byte page header, branch and leaf
  elements), db.go (meta: magic 0xED0CDAED, version 2, FNV-64a checksum), bucket.go (bucket
  header, inline buckets).

The CRC-32C ``hash`` of etcdutl's status is not computed: it adds no check the SHA-256 lacks.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xED0CDAED
VERSION = 2
BRANCH, LEAF, META, FREELIST = 0x01, 0x02, 0x04, 0x10
BUCKET_LEAF = 0x01
PAGE_HEADER = struct.Struct("<QHHI")      # id, flags, count, overflow
META_BODY = struct.Struct("<IIIIQQQQQQ")   # magic, version, pageSize, flags, root{pgid, seq},
#                                           freelist, pgid (high water mark), txid, checksum
BRANCH_ELEM = struct.Struct("<IIQ")        # pos, ksize, pgid
LEAF_ELEM = struct.Struct("<IIII")         # flags, pos, ksize, vsize
BUCKET_HEADER = struct.Struct("<QQ")       # root pgid (0: inline), sequence


class SnapshotError(ValueError):
    """A snapshot file that is not a whole etcd snapshot; the message says what is wrong."""


@dataclass(frozen=True)
class SnapshotStatus:
    revision: int
    total_keys: int
    total_size: int
    #: the db's SHA-256 matched the trailer etcd appended (False: no trailer, e.g. a copy of
    #: member/snap/db rather than a snapshot)
    checksum: bool


def _fnv64a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class _Db:
    def __init__(self, data: bytes) -> None:
        self.data = data
        first = self._meta_at(0)  # page 0 starts the file whatever the page size
        sizes = [first[2]] if first else [4096, 8192, 16384, 65536]
        second = next((m for size in sizes if (m := self._meta_at(size))), None)
        metas = [m for m in (first, second) if m]
        if not metas:
            raise SnapshotError("no valid bbolt meta page (not an etcd database, or its first "
                                "pages are damaged)")
        meta = max(metas, key=lambda m: m[8])  # the newest transaction wins, as in bbolt
        self.page_size, self.root, self.high = meta[2], meta[4], meta[7]
        if self.high * self.page_size > len(data):
            raise SnapshotError(f"truncated: the database claims {self.high} pages of "
                                f"{self.page_size} bytes, the file has {len(data)} bytes")

    def _meta_at(self, offset: int) -> tuple[int, ...] | None:
        end = offset + PAGE_HEADER.size + META_BODY.size
        if end > len(self.data):
            return None
        _, flags, _, _ = PAGE_HEADER.unpack_from(self.data, offset)
        body = META_BODY.unpack_from(self.data, offset + PAGE_HEADER.size)
        if flags != META or body[0] != MAGIC or body[1] != VERSION:
            return None
        raw = self.data[offset + PAGE_HEADER.size:end - 8]
        return body if _fnv64a(raw) == body[9] else None

    def page(self, pgid: int, want: int, buf: bytes | None = None,
             base: int | None = None) -> tuple[bytes, int, int]:
        """(buffer, offset of the page, element count), its flags checked."""
        if buf is None:
            if pgid < 2 or pgid >= self.high:
                raise SnapshotError(f"page {pgid} is outside the database (2..{self.high - 1})")
            buf, base = self.data, pgid * self.page_size
        assert base is not None
        _, flags, count, _ = PAGE_HEADER.unpack_from(buf, base)
        if not flags & want:
            raise SnapshotError(f"page {pgid}: flags {flags:#x}, expected a branch or leaf page")
        return buf, base, count

    def items(self, root: int, buf: bytes | None = None, base: int | None = None,
              depth: int = 0) -> list[tuple[bytes, bytes, int]]:
        """Every (key, value, flags) under a bucket's root, in key order."""
        if depth > 64:
            raise SnapshotError("the B+tree is deeper than 64 levels: a page cycle")
        buf, base, count = self.page(root, BRANCH | LEAF, buf, base)
        flags = PAGE_HEADER.unpack_from(buf, base)[1]
        out: list[tuple[bytes, bytes, int]] = []
        at = base + PAGE_HEADER.size
        if flags & BRANCH:
            for i in range(count):
                _, _, child = BRANCH_ELEM.unpack_from(buf, at + i * BRANCH_ELEM.size)
                out += self.items(child, depth=depth + 1)
            return out
        for i in range(count):
            e = at + i * LEAF_ELEM.size
            eflags, pos, ksize, vsize = LEAF_ELEM.unpack_from(buf, e)
            k = buf[e + pos:e + pos + ksize]
            v = buf[e + pos + ksize:e + pos + ksize + vsize]
            if len(k) != ksize or len(v) != vsize:
                raise SnapshotError(f"page {root}: element {i} runs past the page's data")
            out.append((k, v, eflags))
        return out

    def bucket(self, value: bytes) -> list[tuple[bytes, bytes, int]]:
        root, _ = BUCKET_HEADER.unpack_from(value, 0)
        if root == 0:  # an inline bucket: its one leaf page follows the header
            return self.items(0, value, BUCKET_HEADER.size)
        return self.items(root)


def status(data: bytes) -> SnapshotStatus:
    """What ``etcdutl snapshot status`` says of a snapshot (and whether its trailer matched);
    SnapshotError when the file is damaged."""
    checksum = len(data) % 512 == 32
    if checksum:
        body, trailer = data[:-32], data[-32:]
        if hashlib.sha256(body).digest() != trailer:
            raise SnapshotError("its SHA-256 does not match the one etcd appended: the file "
                                "changed after etcd wrote it")
        data = body
    db = _Db(data)
    total = 0
    revision = 0
    for name, value, flags in db.items(db.root):
        if not flags & BUCKET_LEAF:
            raise SnapshotError(f"top-level key {name!r} is not a bucket")
        entries = db.bucket(value)
        total += len(entries)
        if name == b"key" and entries:
            revision = struct.unpack_from(">Q", entries[-1][0], 0)[0]
    return SnapshotStatus(revision, total, db.high * db.page_size, checksum)


def status_of(path: Path) -> SnapshotStatus:
    return status(path.read_bytes())
