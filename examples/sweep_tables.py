"""Print the paper's Table 1, Table 2 and Fig. 1 numbers (Markdown) from a sweep workspace.

    python examples/sweep_tables.py runs-sweep

Reads ``<ws>/scores/<model>-beam3``, ``-random10`` and ``-random20`` as written by
examples/toy_sweep.sh: Table 1 is coco-caption on one beam-3 caption per test image, Table 2 the
oracle (best of n per image, mean over images) of n = 10 and 20 random samples, and the Fig. 1
columns the mean CIDEr-D and self-CIDEr of the 10 random samples.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = [("xe", "Att2in-XE"), ("scst", "SCST"), ("scst-mean", "SCST, mean baseline"), ("xe-cider", "XE+5CIDEr"),
         ("dpp-m2", "R-DPP (m=2)"), ("dpp-m3", "R-DPP (m=3)"), ("dpp-m5", "R-DPP (m=5)"), ("dpp-m7", "R-DPP (m=7)"),
         ("dpp-m5-mean", "R-DPP (m=5), mean baseline")]
METRICS = [("Bleu_4", "B-4"), ("METEOR", "M"), ("ROUGE_L", "R"), ("CIDEr", "C")]


def _load(ws: Path, name: str, tag: str) -> dict | None:
    p = ws / "scores" / f"{name}-{tag}" / "scores.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _f(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def main(ws: Path) -> None:
    rows = [(n, label) for n, label in ORDER if (ws / "scores" / f"{n}-beam3").is_dir()]
    print("Table 1: one caption per test image by beam search (bw 3), coco-caption\n")
    print("| model | bw | B-4 | M | R | C | S |\n|---|---|---|---|---|---|---|")
    for name, label in rows:
        acc = (_load(ws, name, "beam3") or {}).get("accuracy", {})
        print(f"| {label} | 3 | " + " | ".join(_f(acc.get(k)) for k, _ in METRICS) + f" | {_f(acc.get('SPICE'))} |")
    print("\nTable 2: oracle (best of # random samples per image, mean over images)\n")
    print("| model | # | B-4 | M | R | C |\n|---|---|---|---|---|---|")
    for name, label in rows:
        for n in (10, 20):
            orc = (_load(ws, name, f"random{n}") or {}).get("oracle", {})
            print(f"| {label} | {n} | " + " | ".join(_f(orc.get(k)) for k, _ in METRICS) + " |")
    print("\nFig. 1: 10 random samples per test image\n")
    print("| model | mean CIDEr | self-CIDEr | Div-2 | mBLEU-4 |\n|---|---|---|---|---|")
    for name, label in rows:
        s = _load(ws, name, "random10") or {}
        div = s.get("diversity", {})
        print(f"| {label} | {_f(s.get('average', {}).get('CIDEr'))} | {_f(div.get('self_cider'))} | "
              f"{_f(div.get('div2'))} | {_f(div.get('mbleu4'))} |")


def results(ws: Path) -> None:
    """docs/experiments.md's results table: greedy CIDEr (``<model>-greedy``, when sampled), and over
    10 random samples per test image the mean and oracle CIDEr, self-CIDEr, distinct captions, Div-2,
    mBLEU-4 and the share that ends in a word that cannot end a sentence."""
    import numpy as np

    from rdpp_cli.metrics.diversity import ending_share

    rows = [(n, label) for n, label in ORDER if (ws / "scores" / f"{n}-random10").is_dir()]
    print("\nResults: greedy caption, and 10 random samples per test image\n")
    print("| model | greedy CIDEr | mean sample CIDEr | oracle CIDEr (best of 10) | self-CIDEr | distinct / 10 | Div-2 "
          "| mBLEU-4 | bad endings |\n|---|---|---|---|---|---|---|---|---|")
    for name, label in rows:
        g = (_load(ws, name, "greedy") or {}).get("accuracy", {}).get("CIDEr")
        s = _load(ws, name, "random10") or {}
        div = s.get("diversity", {})
        smp = ws / "samples" / f"{name}-random10" / "samples.json"
        bad = None
        if smp.is_file():
            caps = [[c.lower() for c in r["captions"]] for r in json.loads(smp.read_text())]
            bad = float(np.nanmean(ending_share(caps)))
        dist = div.get("distinct")
        cells = [_f(g), _f(s.get("accuracy", {}).get("CIDEr")), _f(s.get("oracle", {}).get("CIDEr")),
                 _f(div.get("self_cider")), "–" if dist is None else f"{dist:.2f}", _f(div.get("div2")),
                 _f(div.get("mbleu4")), "–" if bad is None else f"{bad:.1%}"]
        print(f"| {label} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    ws_ = Path(sys.argv[1] if len(sys.argv) > 1 else "runs-sweep")
    main(ws_)
    results(ws_)
