"""Hashes of large HDF5 files computed while they are written, and recomputed fast when checked.

A file's rows are written in blocks of ``block`` rows. Each block's digest is sha256 over the raw
bytes of that block of every named dataset, in order; the file's hash is sha256 over the block
digests. A writer keeps the digests (e.g. in an HDF5 dataset, so that an interrupted write can
resume) and passes ``combine(digests)`` to ``write_manifest`` with ``hash_of=spec(...)``.

``recompute`` (``rdpp verify``, and the content check on read when a file changed on disk since it
was last hashed: ``artifacts.verified``) reads the same bytes again. Where every row of every named
dataset is one uncompressed extent of the file (rdpp's ``FeatureWriter`` layout, or a contiguous
dataset; ``row_extents``), the blocks are read with ``os.pread`` and hashed on several threads at
once (both release the GIL: the check runs at the disk's speed, not one core's); any other layout
is read through h5py, one block after another. benchmarks/data.py measures both.

A writer reads its rows back the same way: ``row_offsets`` and ``read_rows`` (a block just
written, past HDF5's caches), ``block_digests`` (every block an earlier run wrote, with None for
a block with a row that is not in the file), so that a digest it records is of the bytes on disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

_RUN_BYTES = 8 << 20  # the most one pread reads (adjacent rows are read together up to this)


def spec(datasets: Sequence[str], block: int) -> str:
    return f"h5rows:{','.join(datasets)};block={block}"


def parse(hash_of: str) -> tuple[list[str], int]:
    """(dataset names, rows per block) of a ``spec``."""
    if not hash_of.startswith("h5rows:"):
        raise ValueError(f"unknown hash spec {hash_of!r}")
    names, block = hash_of[len("h5rows:"):].split(";block=")
    return names.split(","), int(block)


def block_digest(arrays: Sequence[np.ndarray]) -> bytes:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.digest()


def combine(digests: Sequence[bytes]) -> str:
    h = hashlib.sha256()
    for d in digests:
        h.update(bytes(d))
    return h.hexdigest()


def row_bytes(ds) -> int:
    return int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize


def chunk_offsets(ds) -> np.ndarray | None:
    """File offset of every row of the h5py dataset ``ds``, -1 for a row not written to the file
    (yet); None when its rows are not single uncompressed extents in native byte order (compressed
    or multi-row chunks, variable-length types): then only h5py reads it."""
    import h5py

    n, rb = ds.shape[0] if ds.shape else 0, row_bytes(ds) if ds.shape else 0
    if not n or not ds.dtype.isnative or ds.dtype.hasobject or rb == 0:
        return None
    plist = ds.id.get_create_plist()
    if plist.get_nfilters():
        return None
    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        base = ds.id.get_offset()
        return np.full(n, -1, dtype=np.int64) if base is None else base + np.arange(n, dtype=np.int64) * rb
    if layout != h5py.h5d.CHUNKED or ds.chunks != (1, *ds.shape[1:]):
        return None
    offsets = np.full(n, -1, dtype=np.int64)

    def visit(info):
        if info.filter_mask == 0 and info.size == rb:
            offsets[info.chunk_offset[0]] = info.byte_offset
    if hasattr(ds.id, "chunk_iter"):  # HDF5 >= 1.12.3: every chunk's address in one pass
        ds.id.chunk_iter(visit)
    else:
        for k in range(ds.id.get_num_chunks()):
            visit(ds.id.get_chunk_info(k))
    return offsets


def row_offsets(ds, start: int, stop: int) -> np.ndarray | None:
    """File offsets of rows ``start:stop`` of ``ds`` (a ``chunk_offsets`` layout), each row looked up
    alone (a writer's last block, not the whole index); None when one of them is not in the file."""
    import h5py

    rb = row_bytes(ds)
    if ds.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS:
        base = ds.id.get_offset()
        return None if base is None else base + np.arange(start, stop, dtype=np.int64) * rb
    tail = (0,) * (len(ds.shape) - 1)
    out = np.empty(stop - start, dtype=np.int64)
    for i in range(start, stop):
        info = ds.id.get_chunk_info_by_coord((i, *tail))
        if info.byte_offset is None or info.size != rb or info.filter_mask:
            return None
        out[i - start] = info.byte_offset
    return out


def row_extents(ds, path: Path | str) -> np.ndarray | None:
    """File offset of every row of the h5py dataset ``ds`` (of the file at ``path``), or None when
    its rows are not single uncompressed extents in native byte order or a row is not written
    (``chunk_offsets``): then only h5py reads it. The offsets are checked against h5py's own read of
    the first and the last row."""
    offsets = chunk_offsets(ds)
    if offsets is None or (offsets < 0).any():
        return None
    n, rb = ds.shape[0], row_bytes(ds)
    with open(path, "rb") as f:
        for i in (0, n - 1):
            if os.pread(f.fileno(), rb, int(offsets[i])) != np.ascontiguousarray(ds[i]).tobytes():
                return None
    return offsets


def _runs(offsets: np.ndarray, rb: int, start: int, stop: int):
    """(file offset, bytes) of rows ``start:stop`` in order, adjacent rows merged up to _RUN_BYTES."""
    off, size = int(offsets[start]), rb
    for i in range(start + 1, stop):
        o = int(offsets[i])
        if o == off + size and size + rb <= _RUN_BYTES:
            size += rb
        else:
            yield off, size
            off, size = o, rb
    yield off, size


def _pread_full(fd: int, buf: memoryview, off: int) -> None:
    """Fill ``buf`` from the file ``fd`` at ``off`` (``os.preadv``, going on after a short read);
    OSError when the file ends before it is full."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], off + got)
        if not n:
            raise OSError(f"the file ends inside the extent at {off}")
        got += n


def read_rows(fd: int, offsets: np.ndarray, rb: int, start: int, stop: int) -> np.ndarray:
    """The bytes of rows ``start:stop`` (``offsets``: every row's file offset, ``rb`` bytes a row)
    read from the file ``fd`` into one uint8 array; OSError when the file ends before them."""
    out = np.empty((stop - start) * rb, dtype=np.uint8)
    view, pos = memoryview(out), 0
    for off, size in _runs(offsets, rb, start, stop):
        _pread_full(fd, view[pos:pos + size], off)
        pos += size
    return out


def _pread_digest(fd: int, plans: list[tuple[np.ndarray, int]], start: int, stop: int) -> bytes:
    h = hashlib.sha256()
    buf = memoryview(bytearray(max(_RUN_BYTES, *(rb for _, rb in plans))))
    for offsets, rb in plans:
        for off, size in _runs(offsets, rb, start, stop):
            _pread_full(fd, buf[:size], off)
            h.update(buf[:size])
    return h.digest()


def block_digests(fd: int, plans: list[tuple[np.ndarray, int]], block: int, rows: int, *,
                  threads: int | None = None, advance: Callable[[int], None] | None = None) -> list[bytes | None]:
    """The digest of each row block of the first ``rows`` rows, read from the file ``fd`` now
    (``plans``: ``(chunk_offsets, row bytes)`` of each dataset, in the hash's order), on
    ``threads`` threads; None for a block with a row that is not in the file or past its end."""
    def one(start: int) -> bytes | None:
        stop = min(start + block, rows)
        try:
            d = None if any((o[start:stop] < 0).any() for o, _ in plans) else _pread_digest(fd, plans, start, stop)
        except OSError:  # the file ends before these rows: they were never written
            d = None
        if advance:
            advance(stop - start)
        return d
    with ThreadPoolExecutor(max(1, threads or default_threads())) as pool:
        return list(pool.map(one, range(0, rows, block)))


def default_threads() -> int:
    """Hashing threads: ``$RDPP_HASH_THREADS``, else the cores this process may use, at most 8
    (past that the disk, not hashing, bounds a check)."""
    try:
        return max(1, int(os.environ["RDPP_HASH_THREADS"]))
    except (KeyError, ValueError):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return min(8, cores)


def recompute(path, hash_of: str, *, threads: int | None = None,
              advance: Callable[[int], None] | None = None) -> str:
    """The ``hash_of`` hash of the file at ``path``, read again. ``threads``: hashing threads for
    the direct path (default: ``default_threads()``); ``advance(rows)`` is called after each block."""
    import h5py

    names, block = parse(hash_of)
    with h5py.File(path, "r") as f:
        n = f[names[0]].shape[0]
        plans = [(row_extents(f[d], path), row_bytes(f[d])) for d in names]
        if any(offsets is None for offsets, _ in plans):
            digests = []
            for start in range(0, n, block):
                digests.append(block_digest([f[d][start:start + block] for d in names]))
                if advance:
                    advance(min(block, n - start))
            return combine(digests)
    fd = os.open(path, os.O_RDONLY)
    try:
        digests = block_digests(fd, plans, block, n, threads=threads, advance=advance)
    finally:
        os.close(fd)
    if any(d is None for d in digests):
        raise OSError(f"{path} ends before its last row")
    return combine(digests)
