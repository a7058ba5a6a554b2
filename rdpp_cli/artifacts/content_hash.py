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


def row_extents(ds, path: Path | str) -> np.ndarray | None:
    """File offset of every row of the h5py dataset ``ds`` (of the file at ``path``), or None when
    its rows are not single uncompressed extents in native byte order (compressed or multi-row
    chunks, unwritten chunks, variable-length types): then only h5py reads it. The offsets are
    checked against h5py's own read of the first and the last row."""
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
        offsets = None if base is None else base + np.arange(n, dtype=np.int64) * rb
    elif layout == h5py.h5d.CHUNKED and ds.chunks == (1, *ds.shape[1:]):
        offsets = np.full(n, -1, dtype=np.int64)

        def visit(info):
            if info.filter_mask == 0 and info.size == rb:
                offsets[info.chunk_offset[0]] = info.byte_offset
        if hasattr(ds.id, "chunk_iter"):  # HDF5 >= 1.12.3: every chunk's address in one pass
            ds.id.chunk_iter(visit)
        else:
            for k in range(ds.id.get_num_chunks()):
                visit(ds.id.get_chunk_info(k))
        offsets = None if (offsets < 0).any() else offsets  # an unwritten row: leave it to HDF5
    else:
        return None
    if offsets is None:
        return None
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


def _pread_digest(fd: int, plans: list[tuple[np.ndarray, int]], start: int, stop: int) -> bytes:
    h = hashlib.sha256()
    for offsets, rb in plans:
        for off, size in _runs(offsets, rb, start, stop):
            data = os.pread(fd, size, off)
            while len(data) < size:  # a short read: go on where it stopped
                more = os.pread(fd, size - len(data), off + len(data))
                if not more:
                    raise OSError(f"the file ends inside the extent at {off}")
                data += more
            h.update(data)
    return h.digest()


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
    threads = threads or default_threads()
    fd = os.open(path, os.O_RDONLY)
    try:
        def one(start: int) -> bytes:
            d = _pread_digest(fd, plans, start, min(start + block, n))
            if advance:
                advance(min(block, n - start))
            return d
        with ThreadPoolExecutor(max(1, threads)) as pool:
            return combine(list(pool.map(one, range(0, n, block))))
    finally:
        os.close(fd)
