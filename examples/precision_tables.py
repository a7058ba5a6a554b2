"""The fp32-vs-bf16 tables (Markdown) of a workspace made by examples/precision_sweep.sh.

    python examples/precision_tables.py runs-precision

Per run (model × precision × seed): best greedy val CIDEr-D (the training reward's, from the model
manifest), training time, and on the test split: CIDEr of the greedy caption, mean and oracle CIDEr
and self-CIDEr of 10 random samples (coco-caption CIDEr, `rdpp score`). Then the mean over seeds of
each (model, precision), bf16 minus fp32, and the check of docs/training.md: bf16 within ±0.03
greedy val CIDEr-D of fp32 (mean over seeds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
COLUMNS = ["val CIDEr-D", "greedy CIDEr", "mean sample CIDEr", "oracle CIDEr (10)", "self-CIDEr", "train s"]
TOLERANCE = 0.03


def _json(p: Path) -> dict:
    return json.loads(p.read_text()) if p.is_file() else {}


def _model_dir(ws: Path, name: str) -> Path:
    return ws / ("xe" if name.startswith("xe-") else "finetune") / name


def run_row(ws: Path, name: str) -> dict:
    """The numbers of one run ``name`` (e.g. dpp-m5-bf16-s123); NaN for what is not there yet."""
    model = _model_dir(ws, name)
    summary = _json(model / "manifest.json").get("summary", {})
    metrics = model / "metrics.csv"
    greedy = _json(ws / "scores" / f"{name}-greedy" / "scores.json")
    rand = _json(ws / "scores" / f"{name}-random10" / "scores.json")
    nan = float("nan")
    return {
        "val CIDEr-D": summary.get("val_cider", nan),
        "greedy CIDEr": (greedy.get("accuracy") or {}).get("CIDEr", nan),
        "mean sample CIDEr": (rand.get("average") or {}).get("CIDEr", nan),
        "oracle CIDEr (10)": (rand.get("oracle") or {}).get("CIDEr", nan),
        "self-CIDEr": (rand.get("diversity") or {}).get("self_cider", nan),
        "train s": float(pd.read_csv(metrics)["time"].iloc[-1]) if metrics.is_file() else nan,
    }


def collect(ws: Path) -> pd.DataFrame:
    rows = []
    for d in sorted([*(ws / "xe").glob("xe-*"), *(ws / "finetune").glob("*")]):
        stem = d.name
        for key, label in MODELS:
            for prec in ("fp32", "bf16", "fp16"):
                head = f"{key}-{prec}-s"
                if stem.startswith(head) and stem[len(head):].isdigit():
                    rows.append({"model": label, "precision": prec, "seed": int(stem[len(head):]),
                                 **run_row(ws, stem)})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        out.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) and c != "train s" else
                                     (f"{v:.0f}" if isinstance(v, float) else str(v)) for c, v in zip(cols, r)) + " |")
    return "\n".join(out)


def main(ws: Path) -> None:
    df = collect(ws)
    if df.empty:
        raise SystemExit(f"no runs of examples/precision_sweep.sh under {ws}")
    order = {label: i for i, (_, label) in enumerate(MODELS)} | {"fp32": 0, "bf16": 1, "fp16": 2}
    df = df.sort_values(["model", "precision", "seed"], key=lambda s: s.map(order) if s.name != "seed" else s)
    print(f"Per run ({ws})\n")
    print(_md(df))
    mean = df.groupby(["model", "precision"], sort=False)[COLUMNS].mean().reset_index()
    print("\nMean over seeds\n")
    print(_md(mean))
    print("\nbf16 minus fp32 (means over seeds), and the ±0.03 check on greedy val CIDEr-D\n")
    rows = []
    for _, label in MODELS:
        a = mean[(mean.model == label) & (mean.precision == "fp32")]
        b = mean[(mean.model == label) & (mean.precision == "bf16")]
        if a.empty or b.empty:
            continue
        diff = {c: float(b[c].iloc[0] - a[c].iloc[0]) for c in COLUMNS}
        diff["train s"] = float(a["train s"].iloc[0] / b["train s"].iloc[0])  # fp32 time / bf16 time
        ok = abs(diff["val CIDEr-D"]) <= TOLERANCE if np.isfinite(diff["val CIDEr-D"]) else None
        rows.append({"model": label, **{f"Δ {c}" if c != "train s" else "fp32 s / bf16 s": v for c, v in diff.items()},
                     f"|Δ val| ≤ {TOLERANCE}": {True: "yes", False: "no", None: "–"}[ok]})
    if rows:
        print(_md(pd.DataFrame(rows)))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs-precision"))
