"""The two-seed table of XE, SCST and R-DPP from workspaces made by objective_sweep.sh.

    python examples/objective_tables.py NEW_WS [OLD_WS]

For XE, SCST and R-DPP m = 2, 5 (seed-123 runs named scst, dpp-m2, dpp-m5; seed-7 runs with the
suffix -s7): greedy CIDEr (one greedy caption per test image), and over 10 random samples per test
image the mean CIDEr, the oracle (best of 10), self-CIDEr, and the share of samples that end in a
word that cannot end a sentence (``rdpp_cli.metrics.diversity.BAD_ENDINGS``, computed from
samples.json, so that artifacts of any rdpp version are read the same way). With OLD_WS (the same
runs made by another rdpp version or objective) each cell shows "old → new". Then the checks of
docs/experiments.md on the seed means.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from rdpp_cli.metrics.diversity import ending_share

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m2", "R-DPP m=2"), ("dpp-m5", "R-DPP m=5")]
SEEDS = (123, 7)
COLS = ("greedy", "mean", "oracle", "self_cider", "bad_ending")


def _json(p: Path) -> dict | None:
    return json.loads(p.read_text()) if p.is_file() else None


def row(ws: Path, name: str) -> dict[str, float] | None:
    g = _json(ws / "scores" / f"{name}-greedy" / "scores.json")
    r = _json(ws / "scores" / f"{name}-random10" / "scores.json")
    smp = _json(ws / "samples" / f"{name}-random10" / "samples.json")
    if g is None or r is None or smp is None:
        return None
    caps = [[c.lower() for c in s["captions"]] for s in smp]
    return {"greedy": g["accuracy"]["CIDEr"], "mean": r["accuracy"]["CIDEr"], "oracle": r["oracle"]["CIDEr"],
            "self_cider": r["diversity"]["self_cider"], "bad_ending": float(np.nanmean(ending_share(caps)))}


def runs(ws: Path, model: str) -> list[dict[str, float]]:
    names = [model] if model == "xe" else [model if s == 123 else f"{model}-s{s}" for s in SEEDS]
    return [x for x in (row(ws, n) for n in names) if x is not None]


def mean(rs: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([r[k] for r in rs])) for k in COLS}


def main(new: Path, old: Path | None) -> None:
    print("| model | seed | greedy CIDEr | mean sample CIDEr | oracle (best of 10) | self-CIDEr | bad endings |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    means = {}
    for model, label in MODELS:
        names = [("xe", "123")] if model == "xe" else [(model if s == 123 else f"{model}-s{s}", str(s)) for s in SEEDS]
        for name, seed in names:
            n, o = row(new, name), row(old, name) if old else None
            if n is None:
                continue
            cells = [(f"{o[k]:.3f} → {n[k]:.3f}" if o else f"{n[k]:.3f}") if k != "bad_ending" else
                     (f"{o[k]:.1%} → {n[k]:.1%}" if o else f"{n[k]:.1%}") for k in COLS]
            print(f"| {label} | {seed} | " + " | ".join(cells) + " |")
        rs = runs(new, model)
        if rs:
            means[model] = mean(rs)
    if {"xe", "scst", "dpp-m5"} <= set(means):
        xe, scst, dpp = means["xe"], means["scst"], means["dpp-m5"]
        print("\nChecks on the seed means (NEW_WS):")
        print(f"- R-DPP m=5 self-CIDEr / SCST's = {dpp['self_cider'] / scst['self_cider']:.2f} (≥ 1.5)")
        print(f"- R-DPP m=5 oracle {dpp['oracle']:.3f} vs SCST {scst['oracle']:.3f} (≥)")
        print(f"- R-DPP m=5 mean sample CIDEr / XE's = {dpp['mean'] / xe['mean']:.2f} (≥ 1.1)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs-sweep"), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
