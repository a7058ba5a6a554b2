"""Whole training epochs with data loading, as ``rdpp train-xe`` and ``rdpp finetune`` run them (a GPU).

Whole epochs over a synthetic artifact of ``--rows``
images built on the spot (its training df made from its captions, the end token counted, when RL
epochs are asked for), data loading included, as the runs' own ``metrics.csv`` reports them
(images/s from the first step to the last, the loader's workers and pinned memory as ``--workers
W`` uses them), for each cache state (``--caches``: warm, cold) and worker count: one ``rdpp
train-xe`` epoch (paper preset, V = 9,487) for each ``--xe-configs`` batch size, precision and
scheduled sampling (default: the preset's batch, without and with scheduled sampling), and, with ``--rl-epoch dpp,scst``, one ``rdpp finetune --preset paper
--m 5`` epoch of each reward (the preset's batch) from the first XE epoch's model. Untimed epochs of each
kind over 256 images come first (CUDA's lazy start-up). ``benchmarks/recipe_hours.py`` turns the
JSON line into the paper recipe's GPU-hours. On a 16-core machine building the 8 GB of features
takes about a minute.

    python benchmarks/data_epochs.py --device cuda --rows 10000 --workers 0,1,2,4 [--json]
                                     [--xe-configs 128:fp32,128:fp32:ss] [--val 500] [--caches warm,cold] [--rl-epoch dpp,scst]
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
from common import BATCH, COCO_TRAIN_IMAGES, data_parser, recipe, write_artifact  # noqa: E402
from timing import drop_cache  # noqa: E402


def parse_configs(spec: str) -> list[tuple[int, str, bool]]:
    """``128:fp32,128:fp32:ss`` -> [(128, "fp32", False), (128, "fp32", True)]: XE epochs' batch size,
    precision and whether scheduled sampling runs (at the schedule's largest probability)."""
    out = []
    for item in filter(None, spec.split(",")):
        b, prec, *ss = item.split(":")
        if not b.isdigit() or prec not in ("fp32", "bf16", "fp16") or ss not in ([], ["ss"]):
            raise SystemExit(f"--xe-configs {spec}: give BATCH:PRECISION[:ss] items, e.g. 128:fp32,128:fp32:ss")
        out.append((int(b), prec, bool(ss)))
    return out


def xe_options(ss: bool, **kw):
    """train-xe's options; ``ss``: scheduled sampling from the first epoch at ``ss_max`` (the preset
    starts it at epoch 0 with probability 0 that grows every 5 epochs: 25 of its 30 epochs run it)."""
    from rdpp_cli.training.options import XEOptions

    class EverySS(XEOptions):
        def ss_prob(self, epoch: int) -> float:
            return self.ss_max

    return EverySS(**kw, ss_start=0) if ss else XEOptions(**kw)


def _epoch_row(out: Path, wall: float, train_rows: int) -> dict:
    """The run's metrics.csv row: images/s of the training steps, the epoch's seconds (validation and
    saving included) and what validation and saving took beyond the steps."""
    import csv

    with open(out / "metrics.csv") as f:
        row = list(csv.DictReader(f))[-1]
    ips, t = float(row["images_per_s"]), float(row["time"])
    return {"images_per_s": ips, "epoch_s": t, "val_s": max(t - train_rows / ips, 0.0), "call_s": wall}


def bench_epochs(work: Path, rows: int, workers: list[int], device: str, preset: str = "paper",
                 configs=((BATCH, "fp32", False),), caches=("warm", "cold"), rl_rewards=(), m: int = 5,
                 val: int = 0) -> dict:
    """Whole epochs through ``train_xe`` (each of ``configs``) and, from the first XE run's model,
    through ``finetune`` (each of ``rl_rewards`` at ``m`` samples, the paper preset's batch), data
    loading included, validating on ``val`` images, for each worker count and cache state; the
    rates are the runs' own ``metrics.csv`` rows. Untimed epochs over 256 images come first."""
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    import torch

    res: dict = {"rows": rows, "val": val, "device": device, "preset": preset, "epochs": []}
    art, rl_batch = work / "xe-data", recipe("att2in", "finetune", "paper")["batch_size"]
    t = time.perf_counter()
    res.update(write_artifact(art, rows, real_df=bool(rl_rewards), val=val))
    res["build_s"] = time.perf_counter() - t
    if device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()
    small = work / "warmup-data"  # untimed epochs of every kind first (CUDA's lazy start-up, kernels chosen)
    write_artifact(small, 256, real_df=bool(rl_rewards), val=min(val, 32))
    for cache, w in [("untimed", 0)] + [(c, w) for c in caches for w in workers]:
        data = small if cache == "untimed" else art
        n_val = min(val, 32) if cache == "untimed" else val
        init = work / f"init-{data.name}"  # the model the RL epochs start from: the first XE epoch's on data

        def epoch(stage: str, run, **kw):
            if cache == "cold":
                res["cold_method"] = drop_cache([art / "features.h5"])
            out = init if stage == "xe" and not init.exists() else work / f"run-{stage}"
            t = time.perf_counter()
            run(out)
            if cache != "untimed":
                res["epochs"].append({"stage": stage, **kw, "cache": cache, "workers": w,
                                      **_epoch_row(out, time.perf_counter() - t, rows - val)})
            if out != init:
                shutil.rmtree(out, ignore_errors=True)

        for batch, prec, ss in configs:
            epoch("xe", lambda out: train_xe(xe_options(
                ss, data=data, out=out, preset=preset, epochs=1, batch_size=batch, val_images=n_val, device=device,
                workers=w, precision=prec, force=True, resume=False)), batch=batch, precision=prec, ss="ss" if ss else "")
        for reward in rl_rewards:
            epoch(reward, lambda out: finetune(init, data=data, reward=reward, m=m, preset="paper", epochs=1,
                                               val_images=n_val, device=device, workers=w, force=True, resume=False,
                                               out=out), m=m, batch=rl_batch, precision="fp32")
    return res


def print_table(xe: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"whole epochs, {args.preset} preset, {args.rows:,} images of 196×2,048 fp16 "
                    f"({xe.get('gpu', args.device)}; data loading included)")
    for c in ("stage", "batch", "precision", "cache", "workers", "images/s", "epoch s", "val s",
              "a COCO epoch (113,287 images) s"):
        t.add_column(c, justify="right")
    for e in xe["epochs"]:
        stage = (e["stage"] + (" ss" if e.get("ss") else "")) if e["stage"] == "xe" else f"{e['stage']} m={e['m']}"
        t.add_row(stage, str(e["batch"]), e["precision"], e["cache"], str(e["workers"]), f"{e['images_per_s']:,.0f}",
                  f"{e['epoch_s']:.1f}", f"{e['val_s']:.1f}", f"{COCO_TRAIN_IMAGES / e['images_per_s']:,.0f}")
    Console(width=160).print(t)


def main() -> None:
    ap = data_parser(__doc__, keep=False)
    ap.add_argument("--workers", default="0,1,2", help="DataLoader worker counts, comma-separated")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="paper", help="the XE epochs' model (small: a CPU check of the code path)")
    xe_batch = recipe("att2in", "xe", "paper")["batch_size"]
    ap.add_argument("--xe-configs", default=f"{xe_batch}:fp32,{xe_batch}:fp32:ss",
                    help="BATCH:PRECISION[:ss],... of the XE epochs (ss: scheduled sampling on)")
    ap.add_argument("--val", type=int, default=0, help="rows in the val split, validated after every epoch")
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
                          [r for r in args.rl_epoch.split(",") if r], args.m, args.val)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(xe, args)
    if args.json:  # benchmarks/recipe_hours.py reads this line
        print(json.dumps({"benchmark": "data_epochs", "rows": args.rows, "cpus": os.cpu_count(),
                          "load_average_start_end": [load0, os.getloadavg()], "xe_epoch": xe}))


if __name__ == "__main__":
    main()
