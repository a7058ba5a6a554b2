"""The training loader at COCO's feature shape against reading the same rows from memory-mapped files.

A data artifact with ``--rows`` images of COCO's feature shape (196 × 2,048 fp16 att
+ 2,048 fp16 fc, 0.81 MB an image) written by rdpp's ``FeatureWriter``, five 16-token captions each.
Batches of 50 images in the shuffled order training reads them (``CaptionBatches``), with 0, 1, 2
read-ahead workers; against the physical reference: numpy reading the same rows (sorted) from
memory-mapped ``.npy`` files of the same features; and against rdpp 0.1.0's loader (commit 787cd4c:
h5py fancy indexing of the batch rows, float32 in the batch), on fewer batches since it is slow.
Both are checked to give the same numbers first. Passes are interleaved (one of each per round)
and the median over rounds is reported. *Warm*: every row read is in the page cache; *cold*: both
files are dropped from the page cache (``posix_fadvise(DONTNEED)``; ``/proc/sys/vm/drop_caches``
when writable) before every pass. images/s counts from the first batch delivered to the last
(steady state; the time to the first batch, which includes starting the workers, is reported
apart).

    python benchmarks/data_loader.py [--json] [--rows 10000] [--workers 0,1,2] [--images 2500] [--rounds 3]
                                     [--old-batches 4] [--dir DIR] [--keep]
    python benchmarks/data_loader.py --rows 300 --images 200 --workers 0 --rounds 1 --old-batches 2   # quick

The artifact and the ``.npy`` files (1.6 GB per 1,000 rows together) go to ``--dir`` (default: a
folder under $TMPDIR) and are deleted at the end unless ``--keep``; a rerun with ``--keep`` and the
same ``--rows`` reuses them.
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

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ATT_DIM, BATCH, REGIONS, ROW_BYTES, data_parser, write_artifact  # noqa: E402
from timing import cached_fraction, drop_cache  # noqa: E402


def old_features(f: h5py.File, idx: np.ndarray):
    """rdpp 0.1.0's feature read (``DataArtifact.features`` at 787cd4c): h5py fancy indexing of
    the sorted unique rows, then float32 arrays."""
    import torch

    uniq, inverse = np.unique(idx, return_inverse=True)
    fc = torch.from_numpy(f["fc"][uniq][inverse].astype(np.float32))
    att = torch.from_numpy(f["att"][uniq][inverse].astype(np.float32))
    return fc, att


def old_captions(labels: h5py.Dataset, start: np.ndarray, end: np.ndarray, idx: np.ndarray, k: int,
                 rng: np.random.Generator) -> np.ndarray:
    """rdpp 0.1.0's ``DataArtifact.captions_per_image`` (at 787cd4c): one HDF5 read per image."""
    out = np.zeros((len(idx), k, labels.shape[1]), dtype=np.int64)
    for b, i in enumerate(idx):
        s, e = int(start[i]), int(end[i])
        rows = np.arange(s, e) if e - s == k else s + rng.choice(e - s, k, replace=e - s < k)
        block = labels[s:e]
        out[b] = block[np.sort(rows) - s] if e - s >= k else block[rows - s]
    return out


def timed_pass(batches) -> tuple[float, float, int]:
    """(seconds to the first batch, images/s from the first batch to the last, images) of a
    generator of batch sizes."""
    t0 = time.perf_counter()
    t_first, n, n_after_first = None, 0, 0
    for b in batches:
        if t_first is None:
            t_first = time.perf_counter()
        else:
            n_after_first += b
        n += b
    t_end = time.perf_counter()
    return (t_first - t0), (n_after_first / (t_end - t_first) if t_end > t_first else float("nan")), n


def bench_loader(art: Path, npy_dir: Path, workers: list[int], images: int, rounds: int, old_batches: int,
                 seed: int = 0) -> dict:
    """Passes over ``images`` of the artifact's rows, warm then cold: rdpp's loader with each worker
    count, numpy memmap (kept mapped, and mapped per pass), rdpp 0.1.0's loader (``old_batches``)."""
    from rdpp_cli.data.dataset import DataArtifact
    from rdpp_cli.data.loader import CaptionBatches

    data = DataArtifact.open(art)
    rows = len(data.image_ids)
    subset = np.sort(np.random.default_rng(seed).permutation(rows)[:min(images, rows)])
    def open_maps():
        return {k: np.load(npy_dir / f"{k}.npy", mmap_mode="r") for k in ("att", "fc")}

    kept = open_maps()  # mapped once: pages touched in earlier passes stay mapped (warm only)
    old_h5, old_caps = h5py.File(art / "features.h5", "r"), h5py.File(art / "captions.h5", "r")

    def loader(w, r):
        b = CaptionBatches(data, images=subset, batch_size=BATCH, seed=seed + r, num_workers=w)
        return (x.size for x in b.epoch(0))

    def memmap(r, maps=None):
        """The rows with numpy from the .npy files: through ``maps`` (kept), or mapped for this pass."""
        b = CaptionBatches(data, images=subset, batch_size=BATCH, seed=seed + r)
        order = b.permutation(0)
        m = maps if maps is not None else open_maps()
        for k in range(len(b)):
            idx = np.sort(b.global_batch(0, k, order))
            att, fc = np.take(m["att"], idx, axis=0), np.take(m["fc"], idx, axis=0)
            yield min(len(att), len(fc))
        del m  # unmapped (np.take made copies), so that the pages can leave the cache

    def old(r):
        b = CaptionBatches(data, images=subset, batch_size=BATCH, seed=seed + r)
        order = b.permutation(0)
        for k in range(old_batches):
            idx = b.global_batch(0, k, order)
            old_captions(old_caps["labels"], data.label_start, data.label_end, idx, 5,
                         np.random.default_rng([seed + r, 0, k]))
            fc, att = old_features(old_h5, idx)
            yield len(att)

    check_first_batch(next(CaptionBatches(data, images=subset, batch_size=BATCH, seed=seed).epoch(0)), data, kept,
                      old_h5, old_caps, seed)
    configs = {**{f"loader w{w}": (lambda r, w=w: loader(w, r)) for w in workers},
               "memmap kept": lambda r: memmap(r, kept), "memmap": memmap, "loader 787cd4c": old}
    files = [art / "features.h5", npy_dir / "att.npy", npy_dir / "fc.npy"]
    res: dict = {"images_per_pass": len(subset), "rounds": rounds, "old_batches": old_batches}
    timed_pass(loader(0, 0))  # warm: every row of the subset in the page cache, through both files
    timed_pass(memmap(0, kept))
    res.update(passes("warm", configs, files, rounds))
    configs.pop("memmap kept")  # mapped pages cannot be dropped from the cache: no kept mapping when cold
    kept.clear()
    res.update(passes("cold", configs, files, rounds))
    old_h5.close(), old_caps.close()
    data.close()
    return res


def check_first_batch(b0, data, kept: dict, old_h5, old_caps, seed: int) -> None:
    """The same numbers from every path, checked before anything is timed: SystemExit if not."""
    import torch

    fc_old, att_old = old_features(old_h5, b0.index)
    labels_old = old_captions(old_caps["labels"], data.label_start, data.label_end, b0.index, 5,
                              np.random.default_rng([seed, 0, 0]))
    if not (np.array_equal(b0.att.numpy(), kept["att"][b0.index]) and np.array_equal(b0.fc.numpy(), kept["fc"][b0.index])
            and torch.equal(b0.to("cpu").att, att_old) and torch.equal(b0.to("cpu").fc, fc_old)
            and np.array_equal(b0.labels.numpy(), labels_old)):
        raise SystemExit("the loader, the memmap reference and the 787cd4c read disagree on the first batch")


def passes(cache: str, configs: dict, files: list[Path], rounds: int) -> dict:
    """``rounds`` interleaved passes of every configuration (cold: ``files`` dropped from the page
    cache before each): median images/s, GB/s and time to the first batch per configuration."""
    times: dict[str, list] = {k: [] for k in configs}
    resident, how, res = [], None, {}
    for r in range(rounds):
        for name, make in configs.items():
            if cache == "cold":
                how = drop_cache(files)
                resident.append(cached_fraction(files[0]))
            times[name].append(timed_pass(make(r)))
    for name, ts in times.items():
        ips = float(np.median([t[1] for t in ts]))
        res[f"{cache} {name}"] = {"images_per_s": ips, "gb_per_s": ips * ROW_BYTES / 1e9,
                                  "first_batch_s": float(np.median([t[0] for t in ts])), "passes": [t[1] for t in ts]}
    if cache == "cold":
        res["cold_method"] = how
        res["cold_resident_features_h5"] = [x for x in resident if x is not None] or None
    return res


def bench_bounds(art: Path, batches: int = 20, rounds: int = 3, seed: int = 1) -> dict:
    """What one warm batch's 50 att rows cost by each way of reading them (ms per batch, median of
    interleaved rounds over the same cached rows): where the loader's time goes."""
    import torch

    from rdpp_cli.data.dataset import DataArtifact

    data = DataArtifact.open(art)
    data.feature_rows([0])
    reader = data._readers["att"]
    rng = np.random.default_rng(seed)
    sets = [np.sort(rng.choice(len(data.image_ids), BATCH, replace=False)) for _ in range(batches)]
    reused = np.empty((BATCH, REGIONS, ATT_DIM), np.float16)
    f = h5py.File(art / "features.h5", "r")

    def shared(idx):  # what a DataLoader worker process must do before handing a batch over
        t = torch.empty(0, dtype=torch.float16).set_(torch.UntypedStorage._new_shared(reused.nbytes), 0, reused.shape)
        reader.read(idx, None, t.numpy())

    ways = {"preadv into a reused buffer": lambda idx: reader.read(idx, None, reused),
            "preadv into new memory (the loader on CPU)": lambda idx: reader.read(idx, None),
            "preadv into new shared memory (a worker process)": shared,
            "h5py, one row at a time": lambda idx: [f["att"][int(i)] for i in idx],
            "h5py fancy indexing (787cd4c)": lambda idx: f["att"][idx]}
    for idx in sets:  # cached
        reader.read(idx, None, reused)
    times: dict[str, list] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, fn in ways.items():
            todo = sets if "h5py" not in name else sets[:2]
            t = time.perf_counter()
            for idx in todo:
                fn(idx)
            times[name].append((time.perf_counter() - t) / len(todo))
    f.close()
    data.close()
    return {k: {"ms_per_batch": 1e3 * float(np.median(v)), "images_per_s": BATCH / float(np.median(v))}
            for k, v in times.items()}


def built_artifact(work: Path, rows: int) -> tuple[Path, Path, dict]:
    """The artifact and its ``.npy`` twins under ``work``: reused when a kept run made them for ``rows``."""
    art, npy, spec = work / "loader-data", work / "loader-npy", work / "loader-spec.json"
    if not (spec.is_file() and json.loads(spec.read_text()).get("rows") == rows):
        shutil.rmtree(art, ignore_errors=True), shutil.rmtree(npy, ignore_errors=True)
        t0 = time.perf_counter()
        built = write_artifact(art, rows, npy)
        built["build_s"] = time.perf_counter() - t0
        spec.write_text(json.dumps(built))
    return art, npy, json.loads(spec.read_text())


def print_tables(res: dict, built: dict, workers: list[int], args) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"loader: batches of {BATCH} of {args.rows:,} COCO-shaped rows (0.81 MB fp16 each), "
                    f"shuffled; features.h5 att chunks {built['layout']['att']['chunks']}; "
                    f"median of {args.rounds} interleaved passes of {res['images_per_pass']:,} images "
                    f"(787cd4c: {args.old_batches} batches); cold by {res.get('cold_method')}")
    for c in ("path", "workers", "warm images/s", "warm GB/s", "cold images/s", "cold GB/s",
              "vs memmap kept (warm)", "vs memmap per pass (warm)", "first batch s (warm)"):
        t.add_column(c, justify="right")
    kept_ref, pass_ref = res["warm memmap kept"]["images_per_s"], res["warm memmap"]["images_per_s"]
    labels = {"loader 787cd4c": "rdpp loader at 787cd4c", "memmap kept": "numpy memmap .npy, mapping kept (reference)",
              "memmap": "numpy memmap .npy, mapped per pass (reference)"}
    for name in [f"loader w{w}" for w in workers] + ["loader 787cd4c", "memmap kept", "memmap"]:
        wm, cd = res[f"warm {name}"], res.get(f"cold {name}")
        wk = name[len("loader w"):] if name.startswith("loader w") else "0" if "787" in name else "-"
        t.add_row(labels.get(name, "rdpp loader"), wk, f"{wm['images_per_s']:,.0f}", f"{wm['gb_per_s']:.2f}",
                  f"{cd['images_per_s']:,.0f}" if cd else "n/a", f"{cd['gb_per_s']:.2f}" if cd else "n/a",
                  f"{wm['images_per_s'] / kept_ref:.2f}×", f"{wm['images_per_s'] / pass_ref:.2f}×",
                  f"{wm['first_batch_s']:.2f}")
    con = Console(width=160)
    con.print(t)
    t = Table(title="where a warm batch's time goes: 50 att rows (40 MB), read by each way")
    for c in ("way", "ms per batch", "images/s"):
        t.add_column(c, justify="right")
    for k, v in res["bounds"].items():
        t.add_row(k, f"{v['ms_per_batch']:.1f}", f"{v['images_per_s']:,.0f}")
    con.print(t)


def main() -> None:
    ap = data_parser(__doc__)
    ap.add_argument("--workers", default="0,1,2", help="DataLoader worker counts, comma-separated")
    ap.add_argument("--images", type=int, default=2_500, help="images per timed pass (50 a batch)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved passes per configuration (median)")
    ap.add_argument("--old-batches", type=int, default=4, help="batches per pass of rdpp 0.1.0's loader (≥ 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    workers = [int(w) for w in args.workers.split(",") if w != ""]
    args.old_batches = max(2, args.old_batches)  # images/s counts from the first batch to the last
    work = args.dir or Path(tempfile.gettempdir()) / "rdpp-bench-data-loader"
    load0 = os.getloadavg()
    try:
        art, npy, built = built_artifact(work, args.rows)
        res = bench_loader(art, npy, workers, args.images, args.rounds, args.old_batches)
        res["bounds"] = bench_bounds(art)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_tables(res, built, workers, args)
    warm = {w: res[f"warm loader w{w}"]["images_per_s"] for w in workers}
    best = max(warm, key=warm.get)
    print(f"load average {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} CPUs")
    if args.json:
        print(json.dumps({"benchmark": "data_loader", "rows": args.rows, "cpus": os.cpu_count(),
                          "load_average_start_end": [load0, os.getloadavg()], "loader": {**built, **res},
                          "loader_images_per_s_warm": warm[best], "workers": best,
                          "memmap_images_per_s_warm": res["warm memmap kept"]["images_per_s"],
                          "memmap_per_pass_images_per_s_warm": res["warm memmap"]["images_per_s"],
                          "loader_images_per_s_cold": res[f"cold loader w{best}"]["images_per_s"],
                          "memmap_images_per_s_cold": res["cold memmap"]["images_per_s"],
                          "old_loader_images_per_s_warm": res["warm loader 787cd4c"]["images_per_s"]}))


if __name__ == "__main__":
    main()
