"""The paper's whole recipe in GPU-hours, projected from measured whole epochs.

The recipe (Wang & Chan 2019, Sec. 4): 30 cross-entropy epochs, then 100 R-DPP epochs at m = 5,
over COCO's 113,287 training images (Karpathy split, restval included). The epochs are those
``benchmarks/data_epochs.py ... --rl-epoch dpp,scst --json`` measured on ``--rows`` COCO-shaped
images (196 × 2,048 fp16 features, data loading included, ``rdpp train-xe`` and ``rdpp finetune
--preset paper`` as a user runs them); a COCO epoch is 113,287 images at the measured images/s.
Validation, checkpoints beyond the epoch's own and start-up are not in it.

Which measurement stands for a setting: of its cache states, the slower (an epoch of 91 GB of
features is read cold at first, and is not sure to stay in the page cache), and of its worker
counts, the faster (the one a user would pick).

    python benchmarks/recipe_hours.py data_epochs.json          # the JSON line of data_epochs.py --json
    python benchmarks/data_epochs.py ... --json | python benchmarks/recipe_hours.py -
"""

from __future__ import annotations

import argparse
import json
import sys

COCO_TRAIN_IMAGES = 113_287
XE_EPOCHS, RL_EPOCHS = 30, 100


def epoch_seconds(images_per_s: float, images: int = COCO_TRAIN_IMAGES) -> float:
    return images / images_per_s


def settings(epochs: list[dict]) -> dict[tuple, float]:
    """{(stage, batch, precision): images/s} from data_epochs.py's epoch rows: the slower cache state of
    each worker count, then the fastest worker count."""
    worst: dict[tuple, float] = {}
    for e in epochs:
        key = (e["stage"], e["batch"], e["precision"], e["workers"])
        worst[key] = min(worst.get(key, float("inf")), e["images_per_s"])
    best: dict[tuple, float] = {}
    for (stage, batch, prec, _), rate in worst.items():
        best[(stage, batch, prec)] = max(best.get((stage, batch, prec), 0.0), rate)
    return best


def recipe_hours(xe_images_per_s: float, rl_images_per_s: float, xe_epochs: int = XE_EPOCHS,
                 rl_epochs: int = RL_EPOCHS, images: int = COCO_TRAIN_IMAGES) -> float:
    """GPU-hours of ``xe_epochs`` XE epochs and ``rl_epochs`` RL epochs over ``images`` images."""
    return (xe_epochs * epoch_seconds(xe_images_per_s, images) + rl_epochs * epoch_seconds(rl_images_per_s, images)) / 3600


def recipes(rates: dict[tuple, float]) -> list[dict]:
    """The paper recipe (XE at batch 50 fp32, then R-DPP at m = 5) and, where measured, its SCST
    twin and the same with the fastest measured XE setting."""
    xe = {k: v for k, v in rates.items() if k[0] == "xe"}
    paper = ("xe", 50, "fp32")
    choices = [("XE batch 50 fp32 (the paper's)", paper)] if paper in xe else []
    if xe and max(xe, key=xe.get) != paper:
        fastest = max(xe, key=xe.get)
        choices.append((f"XE batch {fastest[1]} {fastest[2]} (the fastest measured)", fastest))
    out = []
    for rl, name in (("dpp", "R-DPP"), ("scst", "SCST")):
        measured = [k for k in rates if k[0] == rl]
        if not measured:
            continue
        rl_key = max(measured, key=rates.get)
        for label, key in choices:
            out.append({"recipe": f"{label}, then {name} m=5 (batch {rl_key[1]} {rl_key[2]})",
                        "xe_epoch_s": epoch_seconds(rates[key]), "rl_epoch_s": epoch_seconds(rates[rl_key]),
                        "gpu_hours": recipe_hours(rates[key], rates[rl_key])})
    return out


def load(path: str) -> dict:
    """data_epochs.py's JSON line (the last with an "xe_epoch" entry: logs of the earlier data.py
    --xe-epoch too) from a file or stdin."""
    text = sys.stdin.read() if path == "-" else open(path).read()
    lines = [ln for ln in text.splitlines() if ln.startswith('{"benchmark": "data') and '"xe_epoch"' in ln]
    if not lines:
        raise SystemExit(f"{path}: no line of `benchmarks/data_epochs.py ... --json` in it")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="file holding data_epochs.py --json's output, or - for stdin")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args()
    res = load(args.results)["xe_epoch"]
    rates = settings(res["epochs"])
    where = res.get("gpu") or res["device"]
    print(f"Measured epochs ({res['rows']:,} COCO-shaped images, {res['preset']} preset, {where}), "
          f"as a COCO epoch of {COCO_TRAIN_IMAGES:,} images:")
    print(f"  {'stage':<10}{'batch':>6}{'precision':>10}{'images/s':>10}{'COCO epoch s':>14}")
    for (stage, batch, prec), rate in sorted(rates.items()):
        print(f"  {stage:<10}{batch:>6}{prec:>10}{rate:>10,.0f}{epoch_seconds(rate):>14,.0f}")
    rows = recipes(rates)
    unit = "GPU-hours" if res.get("gpu") else f"hours on the {res['device']}"
    print(f"The recipe, {XE_EPOCHS} XE epochs + {RL_EPOCHS} RL epochs, projected:")
    for r in rows:
        print(f"  {r['recipe']:<72} {XE_EPOCHS} × {r['xe_epoch_s']:,.0f} s + {RL_EPOCHS} × {r['rl_epoch_s']:,.0f} s"
              f" = {r['gpu_hours']:.2f} {unit}")
    if not rows:
        print("  (needs an XE epoch and an RL epoch: data_epochs.py --rl-epoch dpp)")
    if args.json:
        print(json.dumps({"benchmark": "recipe_hours", "device": where, "rates": {"/".join(map(str, k)): v
                          for k, v in rates.items()}, "recipes": rows}))


if __name__ == "__main__":
    main()
