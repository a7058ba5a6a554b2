"""Whole training epochs with data loading, as ``rdpp train-xe`` and ``rdpp finetune`` run them (a GPU).

Whole epochs over a synthetic artifact of ``--rows``
images built on the spot (its training df made from its captions, the end token counted, when RL
epochs are asked for), data loading included, as the runs' own ``metrics.csv`` reports them
(images/s from the first step to the last, the loader's workers and pinned memory as ``--workers
W`` uses them), for each cache state (``--caches``: warm, cold) and worker count: one ``rdpp
train-xe`` epoch (paper preset, V = 9,487) for each ``--xe-configs`` batch size and precision
(``50:fp32`` by default), and, with ``--rl-epoch dpp,scst``, one ``rdpp finetune --preset paper
--m 5`` epoch of each reward (batch 128) from the first XE epoch's model. Untimed epochs of each
kind over 256 images come first (CUDA's lazy start-up). ``benchmarks/recipe_hours.py`` turns the
JSON line into the paper recipe's GPU-hours. On a 16-core machine building the 8 GB of features
takes about a minute.

    python benchmarks/data_epochs.py --device cuda --rows 10000 --workers 0,1,2,4 [--json]
                                     [--xe-configs 50:fp32,200:bf16] [--caches warm,cold] [--rl-epoch dpp,scst]
    python benchmarks/data_epochs.py --device cpu --preset small --rows 300 --rl-epoch dpp   # the code path

Big files go to ``--dir`` (default: a folder under $TMPDIR) and are deleted at the end.
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
from common import BATCH, data_parser, write_artifact  # noqa: E402
from timing import drop_cache  # noqa: E402


def parse_configs(spec: str) -> list[tuple[int, str]]:
    """``50:fp32,200:bf16`` -> [(50, "fp32"), (200, "bf16")]: XE epochs' batch size and precision."""
    out = []
    for item in filter(None, spec.split(",")):
        b, _, prec = item.partition(":")
        if not b.isdigit() or prec not in ("fp32", "bf16", "fp16"):
            raise SystemExit(f"--xe-configs {spec}: give BATCH:PRECISION items, e.g. 50:fp32,200:bf16")
        out.append((int(b), prec))
    return out


def _epoch_row(out: Path, wall: float) -> dict:
    import csv

    with open(out / "metrics.csv") as f:
        row = list(csv.DictReader(f))[-1]
    return {"images_per_s": float(row["images_per_s"]), "epoch_s": float(row["time"]), "call_s": wall}


def _warm_up(work: Path, device: str, preset: str, rl_rewards: list[str], m: int) -> None:
    """Untimed epochs over 256 images of every kind timed later (CUDA's lazy start-up, kernels
    chosen on first use), so that no timed epoch pays for them."""
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    data, xe = work / "warmup-data", work / "warmup-xe"
    write_artifact(data, 256, real_df=bool(rl_rewards))
    train_xe(data, out=xe, preset=preset, epochs=1, batch_size=BATCH, val_images=0, device=device, workers=0,
             force=True, resume=False)
    for reward in rl_rewards:
        finetune(xe, data=data, reward=reward, m=m, preset="paper", epochs=1, val_images=0, device=device,
                 workers=0, force=True, resume=False, out=work / f"warmup-{reward}")
    for d in (data, xe, *(work / f"warmup-{r}" for r in rl_rewards)):
        shutil.rmtree(d, ignore_errors=True)


def bench_epochs(work: Path, rows: int, workers: list[int], device: str, preset: str = "paper",
                 configs=((BATCH, "fp32"),), caches=("warm", "cold"), rl_rewards=(), m: int = 5) -> dict:
    """Whole epochs through ``train_xe`` (each of ``configs``: batch size, precision) and, from the
    first XE run's model, through ``finetune`` (each of ``rl_rewards`` at ``m`` samples, the paper
    preset: batch 128), data loading included, for each worker count and cache state; the rates are
    the runs' own ``metrics.csv`` rows."""
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    import torch

    res: dict = {"rows": rows, "device": device, "preset": preset, "epochs": []}
    art = work / "xe-data"
    t = time.perf_counter()
    res.update(write_artifact(art, rows, real_df=bool(rl_rewards)))
    res["build_s"] = time.perf_counter() - t
    if device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()
    _warm_up(work, device, preset, list(rl_rewards), m)
    init = work / "xe-init"  # the model the RL epochs start from: the first XE epoch's
    for cache in caches:
        for w in workers:
            def epoch(stage: str, run, **kw):
                if cache == "cold":
                    res["cold_method"] = drop_cache([art / "features.h5"])
                out = init if stage == "xe" and not init.exists() else work / f"run-{stage}"
                t = time.perf_counter()
                run(out)
                res["epochs"].append({"stage": stage, **kw, "cache": cache, "workers": w,
                                      **_epoch_row(out, time.perf_counter() - t)})
                if out != init:
                    shutil.rmtree(out, ignore_errors=True)

            for batch, prec in configs:
                epoch("xe", lambda out: train_xe(art, out=out, preset=preset, epochs=1, batch_size=batch, val_images=0,
                                                 device=device, workers=w, precision=prec, force=True, resume=False),
                      batch=batch, precision=prec)
            for reward in rl_rewards:
                epoch(reward, lambda out: finetune(init, data=art, reward=reward, m=m, preset="paper", epochs=1,
                                                   val_images=0, device=device, workers=w, force=True, resume=False,
                                                   out=out), m=m, batch=128, precision="fp32")
    return res


def print_table(xe: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"whole epochs, {args.preset} preset, {args.rows:,} images of 196×2,048 fp16 "
                    f"({xe.get('gpu', args.device)}; data loading included)")
    for c in ("stage", "batch", "precision", "cache", "workers", "images/s", "epoch s", "a COCO epoch (113,287 images) s"):
        t.add_column(c, justify="right")
    for e in xe["epochs"]:
        stage = e["stage"] if e["stage"] == "xe" else f"{e['stage']} m={e['m']}"
        t.add_row(stage, str(e["batch"]), e["precision"], e["cache"], str(e["workers"]),
                  f"{e['images_per_s']:,.0f}", f"{e['epoch_s']:.1f}", f"{113_287 / e['images_per_s']:,.0f}")
    Console(width=160).print(t)


def main() -> None:
    ap = data_parser(__doc__, keep=False)
    ap.add_argument("--workers", default="0,1,2", help="DataLoader worker counts, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="paper", help="the XE epochs' model (small: a CPU check of the code path)")
    ap.add_argument("--xe-configs", default=f"{BATCH}:fp32", help="BATCH:PRECISION,... of the XE epochs")
    ap.add_argument("--caches", default="warm,cold", help="warm, cold or both")
    ap.add_argument("--rl-epoch", default="", help="also RL epochs of these rewards (dpp,scst), paper preset, "
                                                   "from the first XE epoch's model")
    ap.add_argument("--m", type=int, default=5, help="samples per image of --rl-epoch")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    work = args.dir or Path(tempfile.gettempdir()) / "rdpp-bench-data-epochs"
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    try:
        xe = bench_epochs(work, args.rows, [int(w) for w in args.workers.split(",") if w != ""], args.device,
                          args.preset, parse_configs(args.xe_configs), [c for c in args.caches.split(",") if c],
                          [r for r in args.rl_epoch.split(",") if r], args.m)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(xe, args)
    if args.json:  # benchmarks/recipe_hours.py reads this line
        print(json.dumps({"benchmark": "data_epochs", "rows": args.rows, "cpus": os.cpu_count(),
                          "load_average_start_end": [load0, os.getloadavg()], "xe_epoch": xe}))


if __name__ == "__main__":
    main()
