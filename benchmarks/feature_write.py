"""What reading ``features.h5`` back costs its writer, on a COCO-shaped file, projected to COCO.

``FeatureWriter`` counts a block as written only once its rows are read back from the disk
(``os.pread``, past HDF5's caches) and equal what was written; ``finish`` fsyncs the file; a
resumed writer reads back every block an earlier run recorded before it goes on. This script
times, on ``--rows`` COCO-shaped images (196 × 2,048 fp16 ``att`` + 2,048 fp16 ``fc``, blocks of 32:
``prepro coco``'s default batch), the features made beforehand so that only the writing counts:

- *written, read back*: ``FeatureWriter`` as rdpp runs it;
- *written, read back*: the same without the fsync at the end;
- *written, digests from memory*: the same writer with the block digest taken from the arrays in
  memory and no fsync (what it did before it read anything back: the baseline);
- *resume check*: opening the finished file again as a rerun does (every block read back and its
  digest compared), warm (page cache) and cold (dropped before each pass).

The two writes are interleaved (``timing.interleaved``), medians of ``--rounds``; the file goes to
``--dir`` (default: a folder under $TMPDIR), deleted at the end.

    python benchmarks/feature_write.py --rows 1000 [--rounds 3] [--json]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from common import ATT_DIM, REGIONS, data_parser, feature_blocks  # noqa: E402
from timing import drop_cache, interleaved, machine  # noqa: E402

COCO_IMAGES, BLOCK = 123_287, 32


def writers():
    from rdpp_cli.artifacts import content_hash
    from rdpp_cli.data.features import FeatureWriter

    class FromMemory(FeatureWriter):
        """The digest of the arrays in memory, no read-back, no fsync."""

        def _read_back(self, s, k, arrays):
            return content_hash.block_digest(arrays)

        def _sync(self):
            self.f.flush()

    class NoSync(FeatureWriter):
        """Read back, no fsync."""

        def _sync(self):
            self.f.flush()

    return FeatureWriter, NoSync, FromMemory


def write(cls, path: Path, blocks, rows: int) -> str:
    path.unlink(missing_ok=True)
    w = cls(path, np.arange(1, rows + 1), fc_dim=ATT_DIM, regions=REGIONS, block=BLOCK,
            attrs={"backbone": "synthetic", "att_size": 14})
    for _, fc, att in blocks:
        w.write(fc, att)
    return w.finish()["sha256"]


def bench(work: Path, rows: int, rounds: int) -> dict:
    import h5py

    from rdpp_cli.artifacts import content_hash

    read_back, no_sync, from_memory = writers()
    blocks = list(feature_blocks(rows, BLOCK))
    ways = {"read back": read_back, "no fsync": no_sync, "from memory": from_memory}
    paths = {name: work / f"{k}.h5" for k, name in enumerate(ways)}
    t = interleaved({name: (lambda cls=cls, p=paths[name]: write(cls, p, blocks, rows)) for name, cls in ways.items()},
                    rounds)
    hashes = {name: v.result for name, v in t.items()}
    f = paths["read back"]
    assert len(set(hashes.values())) == 1 and hashes["read back"] == content_hash.recompute(f, f"h5rows:fc,att,image_ids;block={BLOCK}")
    with h5py.File(f, "r+") as h:
        h.attrs["_done"] = rows  # finished rows, no manifest yet: what a rerun after a failed manifest opens
    reopen = {"warm": [], "cold": []}
    for _ in range(rounds):
        for cache in ("warm", "cold"):
            if cache == "cold":
                drop_cache([f])
            t0 = time.perf_counter()
            w = read_back(f, np.arange(1, rows + 1), fc_dim=ATT_DIM, regions=REGIONS, block=BLOCK,
                          attrs={"backbone": "synthetic", "att_size": 14})
            reopen[cache].append(time.perf_counter() - t0)
            assert w.done == rows
            w.close()
    size = f.stat().st_size
    out = {name: float(np.median(v.times)) for name, v in t.items()}
    out.update({f"resume check {c}": float(np.median(v)) for c, v in reopen.items()})
    return {"rows": rows, "bytes": size, "seconds": out, "machine": machine()}


def show(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    scale = COCO_IMAGES / res["rows"]
    t = Table(title=f"features.h5 of {res['rows']:,} COCO-shaped images ({res['bytes'] / 1e9:.2f} GB), projected to "
                    f"{COCO_IMAGES:,} images by bytes; {res['machine']}")
    for c in ("way", "s here", "GB/s", "s at COCO"):
        t.add_column(c, justify="right")
    labels = {"from memory": "written, digests from memory (baseline)", "no fsync": "written, read back",
              "read back": "written, read back, fsync at the end (rdpp)",
              "resume check warm": "resume check, warm", "resume check cold": "resume check, cold"}
    for key, label in labels.items():
        s = res["seconds"][key]
        t.add_row(label, f"{s:.2f}", f"{res['bytes'] / s / 1e9:.2f}", f"{s * scale:,.0f}")
    sec = res["seconds"]
    extra = sec["no fsync"] - sec["from memory"]
    t.add_row("reading back: the difference", f"{extra:+.2f}", "-", f"{extra * scale:+,.0f}")
    # the fsync waits for what the disk has not taken yet: the whole file here, the last few GB of a
    # long extraction (the kernel writes dirty pages out as they come), so it is not scaled
    t.add_row("the fsync at the end: the difference", f"{sec['read back'] - sec['no fsync']:+.2f}", "-", "-")
    Console(width=160).print(t)


def main() -> None:
    ap = data_parser(__doc__, keep=False)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved writes of each way (median)")
    ap.set_defaults(rows=1000)
    args = ap.parse_args()
    work = args.dir or Path(tempfile.gettempdir()) / "rdpp-bench-feature-write"
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = bench(work, args.rows, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    show(res)
    if args.json:
        print(json.dumps({"benchmark": "feature_write", **res}))


if __name__ == "__main__":
    main()
