"""Feature extraction speed (images/s) of `rdpp prepro coco` on real photos, against the reference loop.

Photos: the first ``--images`` (48) of ../shared/data/coco-real-390 (real COCO JPEGs, 320×240 to
640×640, two greyscale), the same photos for every row. Backbone: MobileNetV2 with ../shared's
ImageNet trunk (random init when it is absent), ``--image-size`` (448, rdpp's default) and a
G×G grid with G = image size / 32 (14).

Rows, timed ``--repeats`` times each, interleaved, medians reported:

- ``reference``: self-critical.pytorch's ``scripts/prepro_feats.py`` loop: one image at a time,
  read, greyscale stacked to 3 channels, scaled to [0, 1], normalised, one forward pass,
  ``fc = mean``, ``att = adaptive_avg_pool2d``. The reference feeds the image at its own size;
  here it is resized to the same S×S as rdpp's so that both compute the same numbers (checked
  before timing: equal to 1e-3). It reads with PIL (skimage in the original; both call libjpeg).
- ``rdpp``: ``rdpp_cli.data.features.iter_features`` (the loop of `rdpp prepro coco` and
  `rdpp caption`): a DataLoader with ``workers`` processes reading photos, batches of
  ``batch`` images, one forward pass per batch; for each worker count in ``--workers`` and batch
  size in ``--batches``. ``workers=default`` is ``features.default_workers("cpu")`` (a quarter of the cores).

    python benchmarks/prepro.py [--images 48] [--image-size 448] [--repeats 3] [--workers 0,1,default]
                                [--batches 8,32] [--threads N] [--json]

The CPU figure in docs/data.md comes from this script; say the machine's load beside it (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as Fn

from rdpp_cli.data import features as F
from rdpp_cli.data.backbones import build_backbone
from rdpp_cli.data.karpathy import load_karpathy

SHARED = Path(__file__).resolve().parents[2] / "shared"


def photos(root: Path, k: int) -> list[Path]:
    recs = load_karpathy(root / "dataset_coco390.json")
    return [root / "images" / r.relpath for r in recs[:k]]


@torch.no_grad()
def reference(paths, bb) -> tuple[np.ndarray, np.ndarray]:
    """prepro_feats.py's loop (one image at a time), at rdpp's input size."""
    from PIL import Image

    mean = torch.tensor(bb.mean).view(3, 1, 1)
    std = torch.tensor(bb.std).view(3, 1, 1)
    trunk = bb.module.trunk
    fcs, atts = [], []
    for p in paths:
        img = np.asarray(Image.open(p).resize((bb.image_size, bb.image_size), Image.BILINEAR))
        if img.ndim == 2:  # "handle grayscale input images"
            img = np.concatenate([img[:, :, None]] * 3, axis=2)
        x = torch.from_numpy(img.astype("float32") / 255.0).permute(2, 0, 1)
        x = (x - mean) / std  # preprocess = Normalize(ImageNet mean, std)
        y = trunk(x[None])[0]  # my_resnet: the trunk on one image
        fcs.append(y.mean(2).mean(1).numpy())
        atts.append(Fn.adaptive_avg_pool2d(y, [bb.att_size, bb.att_size]).permute(1, 2, 0)
                    .reshape(-1, y.shape[0]).numpy())
    return np.stack(fcs), np.stack(atts)


def rdpp(paths, bb, workers: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    fc, att = zip(*F.iter_features(paths, bb, batch_size=batch, device="cpu", workers=workers))
    return np.concatenate(fc), np.concatenate(att)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=SHARED / "data" / "coco-real-390")
    ap.add_argument("--weights", type=Path, default=SHARED / "weights" / "mobilenet_v2-imagenet-features.pth")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="0,1,default")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["RDPP_NO_PROGRESS"] = "1"
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = photos(args.root, args.images)
    weights = args.weights if args.weights.is_file() else None
    bb = build_backbone("mobilenet_v2", att_size=args.image_size // 32, image_size=args.image_size,
                        weights=weights, pretrained=False)
    workers = sorted({F.default_workers("cpu") if w == "default" else int(w) for w in args.workers.split(",")})
    batches = [int(b) for b in args.batches.split(",")]

    # the same numbers first
    rfc, ratt = reference(paths[:4], bb)
    ofc, oatt = rdpp(paths[:4], bb, 0, 4)
    assert np.allclose(rfc, ofc, atol=1e-3) and np.allclose(ratt, oatt, atol=1e-3), "rdpp != reference"

    rows = {"reference (1 image at a time)": lambda: reference(paths, bb)}
    for w in workers:
        for b in batches:
            rows[f"rdpp workers={w} batch={b}"] = (lambda w=w, b=b: rdpp(paths, bb, w, b))
    times: dict[str, list[float]] = {k: [] for k in rows}
    load0 = os.getloadavg()
    for _ in range(args.repeats):
        for name, fn in rows.items():  # interleaved
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    ref = statistics.median(times["reference (1 image at a time)"])
    result = {
        "images": len(paths), "image_size": args.image_size, "att_size": bb.att_size,
        "weights": str(weights) if weights else "random init", "threads": torch.get_num_threads(),
        "cores": len(os.sched_getaffinity(0)), "default_workers": F.default_workers("cpu"),
        "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in load1],
        "rows": {k: {"median_s": statistics.median(v), "images_per_s": len(paths) / statistics.median(v),
                     "speedup": ref / statistics.median(v)} for k, v in times.items()},
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"feature extraction, mobilenet_v2 {args.image_size}px -> {bb.att_size}x{bb.att_size}x{bb.dim}, "
          f"{len(paths)} real COCO photos, CPU, {result['threads']} torch threads, {result['cores']} cores "
          f"(default workers {result['default_workers']}), median of {args.repeats}")
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}\n")
    print(f"| {'loop':<32} | images/s | vs reference |\n|{'-' * 34}|---------:|-------------:|")
    for k, r in result["rows"].items():
        print(f"| {k:<32} | {r['images_per_s']:8.2f} | {r['speedup']:11.2f}x |")


if __name__ == "__main__":
    main()
