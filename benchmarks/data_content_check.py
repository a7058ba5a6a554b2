"""The content check on read (``Artifact.file``) of a COCO-shaped ``features.h5``, projected to COCO.

What the content check on read (``Artifact.file``, ``artifacts.verified``)
costs on a COCO-shaped ``features.h5`` of ``--rows`` images written by rdpp's ``FeatureWriter`` in
blocks of 32 rows (``prepro coco``'s default batch). *First check* (nothing remembered: a copied
workspace, or a file touched since): ``Artifact.file("features.h5")`` hashing every row block
again (``content_hash.recompute``: ``os.pread`` on ``--check-threads`` threads); the same blocks
read through h5py one after another (the path any other layout takes); and the physical
reference, sha256 of the file's bytes read sequentially on one thread (``sha256sum``). *Cached
check* (every later run): ``Artifact.file`` with the hash remembered — a ``stat`` and a small JSON
read, as a new process does it. All three hashes are checked to be the manifest's first; passes
are interleaved, medians of ``--rounds``, warm (page cache) and cold (dropped before every pass).
Each time is projected to COCO (123,287 images × (196 + 1) × 2,048 fp16, by bytes) and set against
an XE epoch over COCO's 113,287 training images: on a CPU at ``--cpu-step-s`` (2.4) s per
50-image step, on a GPU ``--gpu-epoch-s`` (80) s.

    python benchmarks/data_content_check.py --rows 10000 [--check-threads 8] [--rounds 3] [--json]
    python benchmarks/data_content_check.py --rows 300 --rounds 1   # a quick check

The artifact goes to ``--dir`` (default: a folder under $TMPDIR) and is deleted at the end unless
``--keep``; a rerun with ``--keep`` and the same ``--rows`` reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import h5py  # noqa: E402
import numpy as np  # noqa: E402

from common import BATCH, data_parser, write_artifact  # noqa: E402
from timing import drop_cache  # noqa: E402


COCO_IMAGES, COCO_TRAIN = 123_287, 113_287


def h5py_row_blocks(path: Path, hash_of: str) -> str:
    """The row-block hash read through h5py, one block after another (content_hash's slow path)."""
    from rdpp_cli.artifacts import content_hash

    names, block = content_hash.parse(hash_of)
    with h5py.File(path, "r") as f:
        n = f[names[0]].shape[0]
        return content_hash.combine([content_hash.block_digest([f[d][s:s + block] for d in names])
                                     for s in range(0, n, block)])


def _first_check(art, art_dir: Path, entry: dict):
    """``Artifact.file`` with nothing remembered (a copied workspace): every row block hashed again."""
    from rdpp_cli.artifacts import verified

    def run() -> str:
        (art_dir / verified.VERIFIED).unlink(missing_ok=True)
        verified._SEEN.clear()
        art.file("features.h5")
        return entry["sha256"]

    return run


def bench_content_check(work: Path, rows: int, rounds: int, threads: int | None, cached_calls: int = 200) -> dict:
    from rdpp_cli.artifacts import content_hash, read_artifact, sha256_file, verified

    art_dir, spec = work / "check-data", work / "check-spec.json"
    if not (spec.is_file() and json.loads(spec.read_text()).get("rows") == rows):
        shutil.rmtree(art_dir, ignore_errors=True)
        spec.write_text(json.dumps(write_artifact(art_dir, rows, block=32)))
    art = read_artifact(art_dir, "rdpp.data")
    f, entry = art_dir / "features.h5", art.manifest["files"]["features.h5"]
    if threads:
        os.environ["RDPP_HASH_THREADS"] = str(threads)

    first_check = _first_check(art, art_dir, entry)
    ways = {"first": first_check, "h5py": lambda: h5py_row_blocks(f, entry["hash_of"]),
            "sha256 file": lambda: sha256_file(f)}
    assert ways["h5py"]() == entry["sha256"] and first_check() == entry["sha256"]
    times: dict[str, list[float]] = {f"{c} {w}": [] for c in ("warm", "cold") for w in ways}
    for _ in range(rounds):
        for cache in ("warm", "cold"):
            for name, fn in ways.items():
                method = drop_cache([f]) if cache == "cold" else None
                t = time.perf_counter()
                fn()
                times[f"{cache} {name}"].append(time.perf_counter() - t)
    cached = []
    for _ in range(rounds * cached_calls):
        verified._SEEN.clear()  # a new process: stat + the remembered hashes' JSON
        t = time.perf_counter()
        art.file("features.h5")
        cached.append(time.perf_counter() - t)
    size = f.stat().st_size
    res = {k: {"s": float(np.median(v)), "gb_per_s": size / float(np.median(v)) / 1e9} for k, v in times.items()}
    res["cached"] = {"s": float(np.median(cached))}
    return {"rows": rows, "bytes": size, "threads": content_hash.default_threads(), "cold_method": method,
            "ways": res}


def print_content_check(console, res: dict, cpu_step_s: float, gpu_epoch_s: float) -> None:
    from rich.table import Table

    cpu_epoch = -(-COCO_TRAIN // BATCH) * cpu_step_s
    scale = COCO_IMAGES / res["rows"]
    labels = {"first": f"first check: Artifact.file, row blocks by pread on {res['threads']} threads",
              "h5py": "row blocks through h5py, one after another (other layouts)",
              "sha256 file": "sha256 of the file's bytes, 1 thread (reference)"}
    t = Table(title=f"content check of features.h5: {res['rows']:,} COCO-shaped images ({res['bytes'] / 1e9:.2f} GB), "
                    f"projected to {COCO_IMAGES:,} images; XE epoch {cpu_epoch:,.0f} s on a CPU "
                    f"({cpu_step_s} s/step), {gpu_epoch_s:g} s on a GPU; cold by {res['cold_method']}")
    for c in ("way", "cache", "GB/s", "s here", "s at COCO", "% CPU epoch", "% GPU epoch"):
        t.add_column(c, justify="right")
    ref = res["ways"]
    for key in ("first", "h5py", "sha256 file"):
        for cache in ("warm", "cold"):
            v = ref[f"{cache} {key}"]
            coco = v["s"] * scale
            t.add_row(labels[key], cache, f"{v['gb_per_s']:.2f}", f"{v['s']:.2f}", f"{coco:,.0f}",
                      f"{100 * coco / cpu_epoch:.2f}", f"{100 * coco / gpu_epoch_s:.1f}")
    c = ref["cached"]["s"]
    t.add_row("cached check: Artifact.file, hash remembered", "-", "-", f"{c * 1e3:.3f} ms", f"{c * 1e3:.3f} ms",
              f"{100 * c / cpu_epoch:.5f}", f"{100 * c / gpu_epoch_s:.4f}")
    console.print(t)


def main() -> None:
    ap = data_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved passes of each way (median)")
    ap.add_argument("--check-threads", type=int, default=None, help="hashing threads (default: rdpp's)")
    ap.add_argument("--cpu-step-s", type=float, default=2.4, help="CPU XE seconds per 50-image step")
    ap.add_argument("--gpu-epoch-s", type=float, default=80.0, help="GPU XE epoch seconds")
    args = ap.parse_args()
    from rich.console import Console

    work = args.dir or Path(tempfile.gettempdir()) / "rdpp-bench-data-check"
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = bench_content_check(work, args.rows, args.rounds, args.check_threads)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_content_check(Console(width=160), res, args.cpu_step_s, args.gpu_epoch_s)
    if args.json:
        print(json.dumps({"benchmark": "data_content_check", "rows": args.rows, "content_check": res}))


if __name__ == "__main__":
    main()
