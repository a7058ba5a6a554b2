"""The paper's whole recipe in GPU-hours, projected from measured whole epochs, as the presets run it.

The recipe: ``rdpp train-xe --preset paper`` (Att2in: 30 epochs at batch 128, scheduled sampling from
epoch 0 whose probability is 0 for the first 5 epochs and grows after: 25 epochs take the
step-by-step path), then ``rdpp finetune --preset paper`` (100 R-DPP epochs at m = 5, batch 128),
over COCO's 113,287 training images, validating on its 5,000 val images after every epoch; the
settings are read from the presets (benchmarks/common.py ``recipe``). The epochs are those
``benchmarks/data.py epochs ... --rl-epoch dpp,scst --val N --json`` measured on COCO-shaped images
(196 × 2,048 fp16 features, data loading included); a COCO epoch is 113,287 images at the measured
images/s, and its validation the measured validation (and checkpoint) seconds scaled to 5,000 images.
Start-up is not in it.

Which measurement stands for a setting: of its cache states, the slower (an epoch of 91 GB of
features is read cold at first, and is not sure to stay in the page cache), and of its worker
counts, the faster (the one a user would pick).

    python benchmarks/recipe_hours.py epochs.log          # holds the JSON line of data.py epochs --json
    python benchmarks/data.py epochs ... --json | python benchmarks/recipe_hours.py -
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import COCO_TRAIN_IMAGES, COCO_VAL_IMAGES  # noqa: E402


def epoch_seconds(images_per_s: float, images: int = COCO_TRAIN_IMAGES) -> float:
    return images / images_per_s


def settings(epochs: list[dict]) -> dict[tuple, dict]:
    """{(stage, batch, precision, ss): {"images_per_s", "val_s"}} from `data.py epochs`'s rows: the slower
    cache state of each worker count, then the fastest worker count."""
    worst: dict[tuple, dict] = {}
    for e in epochs:
        key = (e["stage"], e["batch"], e["precision"], e.get("ss", ""), e["workers"])
        if key not in worst or e["images_per_s"] < worst[key]["images_per_s"]:
            worst[key] = {"images_per_s": e["images_per_s"], "val_s": e.get("val_s", 0.0)}
    best: dict[tuple, dict] = {}
    for key, r in worst.items():
        if key[:4] not in best or r["images_per_s"] > best[key[:4]]["images_per_s"]:
            best[key[:4]] = r
    return best


def coco_epoch(r: dict, val: int) -> float:
    """A COCO epoch's seconds at rate ``r``: its training images, and its validation scaled to 5,000 images."""
    return epoch_seconds(r["images_per_s"]) + (r["val_s"] * COCO_VAL_IMAGES / val if val else 0.0)


def recipe_hours(xe: float, xe_ss: float, rl: float, xe_epochs: int = 30, ss_epochs: int = 25,
                 rl_epochs: int = 100) -> float:
    """GPU-hours of the recipe from its epochs' seconds: plain XE, XE with scheduled sampling, RL."""
    return ((xe_epochs - ss_epochs) * xe + ss_epochs * xe_ss + rl_epochs * rl) / 3600


def recipes(rates: dict[tuple, dict], xe: dict, rl: dict, val: int) -> list[dict]:
    """The recipe with each measured RL reward, XE at the preset's batch (``xe``, ``rl``: common.recipe)."""
    plain = rates.get(("xe", xe["batch_size"], "fp32", ""))
    ss = rates.get(("xe", xe["batch_size"], "fp32", "ss"))
    out = []
    for reward, name in (("dpp", "R-DPP"), ("scst", "SCST")):
        r = rates.get((reward, rl["batch_size"], "fp32", ""))
        if plain is None or r is None:
            continue
        x, xs, y = coco_epoch(plain, val), coco_epoch(ss or plain, val), coco_epoch(r, val)
        out.append({"recipe": f"XE batch {xe['batch_size']} fp32, {xe['epochs'] - xe['ss_epochs']} epochs plain + "
                              f"{xe['ss_epochs']} with scheduled sampling{'' if ss else ' (not measured: plain rate)'}, "
                              f"then {rl['epochs']} {name} m=5 epochs (batch {rl['batch_size']} fp32)"
                              + (f", validating {COCO_VAL_IMAGES:,} images per epoch" if val else ", no validation"),
                    "xe_epoch_s": x, "xe_ss_epoch_s": xs, "rl_epoch_s": y,
                    "gpu_hours": recipe_hours(x, xs, y, xe["epochs"], xe["ss_epochs"], rl["epochs"])})
    return out


def load(path: str) -> dict:
    """`data.py epochs`'s JSON line (the last) from a file or stdin."""
    text = sys.stdin.read() if path == "-" else open(path).read()
    lines = [ln for ln in text.splitlines() if ln.startswith('{"benchmark": "data_epochs"')]
    if not lines:
        raise SystemExit(f"{path}: no line of `benchmarks/data.py epochs ... --json` in it")
    return json.loads(lines[-1])


def main() -> None:
    from common import recipe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="file holding data.py epochs --json's output, or - for stdin")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args()
    res = load(args.results)["xe_epoch"]
    rates, where, val = settings(res["epochs"]), res.get("gpu") or res["device"], res.get("val", 0)
    print(f"Measured epochs ({res['rows']:,} COCO-shaped images, {val} validated, {res['preset']} preset, {where}), "
          f"as a COCO epoch of {COCO_TRAIN_IMAGES:,} images (+ validation of {COCO_VAL_IMAGES:,}):")
    for (stage, batch, prec, ss), r in sorted(rates.items()):
        print(f"  {stage + (' ss' if ss else ''):<8}{batch:>6}{prec:>6}{r['images_per_s']:>8,.0f} images/s"
              f"{coco_epoch(r, val):>8,.0f} s")
    rows = recipes(rates, recipe("att2in", "xe"), recipe("att2in", "finetune"), val)
    unit = "GPU-hours" if res.get("gpu") else f"hours on the {res['device']}"
    for r in rows:
        print(f"  {r['recipe']}: {r['gpu_hours']:.2f} {unit}")
    if not rows:
        print("  (needs an XE epoch at the preset's batch and an RL epoch: data.py epochs --rl-epoch dpp)")
    if args.json:
        print(json.dumps({"benchmark": "recipe_hours", "device": where, "recipes": rows,
                          "rates": {"/".join(map(str, k)): v for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
