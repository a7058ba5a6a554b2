"""Time of `rdpp prepro toy` with its default feature backbone (pixstats) and with a randomly
initialised resnet18: the figures of docs/data.md ("Time", and the CPU column of the probe table).

Each run is a fresh child process ``rdpp prepro toy --out TMP --backbone B`` (as a user runs it:
the torch import, drawing the images, the features, hashing and HDF5 all count), the two backbones
alternating (one run of each per round, the order reversed every other round:
benchmarks/timing.py), ``--repeat`` runs each. Wall time, and CPU time (the child's user + system
time). Medians, bests beside; the ratios are of the medians. Before anything is timed, an untimed
run of each on ``--check-images`` images checks that the two artifacts hold the same captions
(``captions.h5``) and differ only in their features, and warms the file cache.

    python benchmarks/prepro_toy.py [--images 3000] [--repeat 3] [--threads N] [--json]

``--threads N`` sets ``OMP_NUM_THREADS`` for the children (default: unset, as a user runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, machine  # noqa: E402

BACKBONES = ("pixstats", "resnet18")


def prepro(out: Path, backbone: str, images: int, env: dict) -> float:
    """One ``rdpp prepro toy`` in a child process; returns its CPU seconds (user + system)."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "rdpp_cli", "prepro", "toy", "--out", str(out), "--images", str(images),
                    "--backbone", backbone], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_captions(a: Path, b: Path) -> None:
    with h5py.File(a / "captions.h5", "r") as fa, h5py.File(b / "captions.h5", "r") as fb:
        for key in ("labels", "label_start", "label_end", "image_ids", "split"):
            if not np.array_equal(fa[key][...], fb[key][...]):
                raise SystemExit(f"the two backbones' artifacts differ in captions.h5 {key}; not timed")
    with h5py.File(a / "features.h5", "r") as fa, h5py.File(b / "features.h5", "r") as fb:
        if fa["att"].shape == fb["att"].shape and np.array_equal(fa["att"][...], fb["att"][...]):
            raise SystemExit("the two backbones wrote the same features; not timed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=3000, help="images of the timed runs (the default set)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each backbone")
    ap.add_argument("--check-images", type=int, default=60, help="images of the untimed check run")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the children")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args()
    env = {**os.environ, "RDPP_NO_PROGRESS": "1"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory(prefix="rdpp-bench-toy-") as tmp:
        outs = {b: Path(tmp) / b for b in BACKBONES}
        for b in BACKBONES:
            prepro(outs[b], b, args.check_images, env)
        same_captions(*outs.values())
        cpu: dict[str, list[float]] = {b: [] for b in BACKBONES}

        def run(b: str):
            return lambda: cpu[b].append(prepro(outs[b], b, args.images, env))

        wall = interleaved({b: run(b) for b in BACKBONES}, args.repeat)
    rows = {b: {"wall_s": round(wall[b].median, 2), "wall_best_s": round(wall[b].best, 2),
                "cpu_s": round(float(np.median(cpu[b])), 2), "cpu_best_s": round(min(cpu[b]), 2)} for b in BACKBONES}
    a, b = BACKBONES
    out = {"benchmark": "prepro_toy", "images": args.images, "repeat": args.repeat, "threads": args.threads,
           "rows": rows, "cpu_ratio": round(float(np.median(cpu[b]) / np.median(cpu[a])), 2),
           "wall_ratio": round(wall[b].median / wall[a].median, 2), "machine": machine()}
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"rdpp prepro toy --images {args.images}: {args.repeat} interleaved runs each, medians (bests), "
                    f"OMP_NUM_THREADS={args.threads or 'unset'}", title_justify="left")
    for col in ("backbone", "wall s", "CPU s (user + sys)"):
        t.add_column(col, justify="left" if col == "backbone" else "right")
    for k, r in rows.items():
        t.add_row(k, f"{r['wall_s']:.1f} ({r['wall_best_s']:.1f})", f"{r['cpu_s']:.1f} ({r['cpu_best_s']:.1f})")
    Console(width=120).print(t)
    print(f"{b} / {a}: {out['cpu_ratio']:.1f}x the CPU time, {out['wall_ratio']:.1f}x the wall time (medians)")
    print(out["machine"])
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
