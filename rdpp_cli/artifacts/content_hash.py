"""Hashes of large HDF5 files computed while they are written, never by re-reading them.

A file's rows are written in blocks of ``block`` rows. Each block's digest is sha256 over the raw
bytes of that block of every named dataset, in order; the file's hash is sha256 over the block
digests. A writer keeps the digests (e.g. in an HDF5 dataset, so that an interrupted write can
resume) and passes ``combine(digests)`` to ``write_manifest`` with ``hash_of=spec(...)``. The full
check (``Artifact.verify``) recomputes the same hash from the file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def spec(datasets: Sequence[str], block: int) -> str:
    return f"h5rows:{','.join(datasets)};block={block}"


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


def recompute(path, hash_of: str) -> str:
    import h5py

    if not hash_of.startswith("h5rows:"):
        raise ValueError(f"unknown hash spec {hash_of!r}")
    names, block = hash_of[len("h5rows:"):].split(";block=")
    names_l, block_i = names.split(","), int(block)
    digests = []
    with h5py.File(path, "r") as f:
        n = f[names_l[0]].shape[0]
        for start in range(0, n, block_i):
            digests.append(block_digest([f[d][start:start + block_i] for d in names_l]))
    return combine(digests)
