"""Tables, frontier comparison and plot of examples/selection_sweep.sh (Markdown on stdout).

    python examples/selection_tables.py WS [--candidates 50] [--ks 5,10] [--out WS/selection.png]

Reads ``WS/scores/sel-<model>-<tag>/scores.json`` (``rdpp score --oracle --self-cider --diversity``):

1. for each K, every decoding of the XE, SCST and R-DPP m=5 models: mean CIDEr (``average``), oracle
   CIDEr (best of K), self-CIDEr, Div-2;
2. the goal: does a DPP-selected set beat random sampling of the same model at the same K on
   oracle CIDEr *and* self-CIDEr; how far are the XE model's DPP sets from R-DPP m=5's samples;
3. the frontier: for the R-DPP points (10 random samples, m = 2, 3, 5, 7) and the 10-caption sets
   chosen from C samples, the height above (+) or below (-) the temperature curves of XE and SCST
   (10 samples per image) at the same self-CIDEr: the highest of the curve's segments (between
   neighbouring temperatures) that span that self-CIDEr; "outside" when none does;
4. the plot: x = self-CIDEr, y = mean CIDEr, the K = 10 points, the curves and the human point.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
METHODS = [("random-k{K}", "random sampling", "random"), ("beam-k{K}", "beam search (K beams)", "beam"),
           ("dbs-k{K}", "diverse beam search (K groups)", "DBS"),
           ("logprob-c{C}-k{K}", "--select logprob", "logprob"), ("mbr-c{C}-k{K}", "--select mbr", "MBR"),
           ("dpp-consensus-c{C}-k{K}", "--select dpp, consensus", "DPP-cons"),
           ("dpp-logprob-c{C}-k{K}", "--select dpp, logprob", "DPP-lp")]
DPP_MS = (2, 3, 5, 7)
COLOURS = {"xe": "tab:blue", "scst": "tab:orange", "dpp-m5": "tab:green", "dpp": "tab:green"}
K_PLOT = 10  # the plot's set size: the temperature curves have 10 samples per image


def load(ws: Path, name: str) -> dict | None:
    """(mean CIDEr, oracle CIDEr, self-CIDEr, Div-2) and the human point of scores/sel-<name>."""
    p = ws / "scores" / f"sel-{name}" / "scores.json"
    if not p.is_file():
        return None
    s = json.loads(p.read_text())
    div = s.get("diversity") or {}
    return {"mean": (s.get("average") or {}).get("CIDEr"), "oracle": (s.get("oracle") or {}).get("CIDEr"),
            "self": div.get("self_cider"), "div2": div.get("div2"), "human": s.get("human")}


def _f(x, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def curve(ws: Path, label: str) -> list[tuple[float, float, str]]:
    """The temperature curve of a model: (self-CIDEr, mean CIDEr, "T=...") in temperature order."""
    pts = []
    for d in (ws / "scores").glob(f"sel-{label}-random-k10*"):
        m = re.fullmatch(rf"sel-{re.escape(label)}-random-k10(?:-t([0-9.]+))?", d.name)
        s = load(ws, d.name[4:]) if m else None
        if s and s["self"] is not None and s["mean"] is not None:
            pts.append((float(m.group(1) or 1.0), s["self"], s["mean"]))
    return [(x, y, f"T={t:g}") for t, x, y in sorted(pts)]


def height_above(pts: list[tuple[float, float, str]], x: float, y: float) -> float | None:
    """y minus the highest curve segment spanning x (None when no segment spans x)."""
    best = None
    for (x0, y0, _), (x1, y1, _) in zip(pts, pts[1:]):
        lo, hi = min(x0, x1), max(x0, x1)
        if lo <= x <= hi:
            yc = y0 if hi == lo else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            best = yc if best is None else max(best, yc)
    return None if best is None else y - best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ws", type=Path)
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--ks", default="5,10")
    ap.add_argument("--out", type=Path, default=None, help="the plot (default: WS/selection.png)")
    args = ap.parse_args()
    ws, C = args.ws, args.candidates
    ks = [int(k) for k in args.ks.split(",")]
    human = None

    for K in ks:
        print(f"\n### K = {K} captions per image ({C} random samples as candidates for --select)\n")
        print("| model | decoding | mean CIDEr | oracle CIDEr | self-CIDEr | Div-2 |\n|---|---|---|---|---|---|")
        for label, model in MODELS:
            for tag, what, _ in METHODS:
                s = load(ws, f"{label}-{tag.format(K=K, C=C)}")
                if s is None:
                    continue
                human = human or s["human"]
                print(f"| {model} | {what} | {_f(s['mean'])} | {_f(s['oracle'])} | {_f(s['self'])} | {_f(s['div2'])} |")

    print("\n### Goal: a DPP-selected set beats random sampling of the same model at the same K on oracle "
          "CIDEr and self-CIDEr\n")
    print("| model | K | selection | Δ oracle CIDEr | Δ self-CIDEr | both higher |\n|---|---|---|---|---|---|")
    for K in ks:
        for label, model in MODELS:
            rand = load(ws, f"{label}-random-k{K}")
            for tag, what, _ in METHODS[5:]:
                s = load(ws, f"{label}-{tag.format(K=K, C=C)}")
                if s is None or rand is None or None in (s["oracle"], s["self"], rand["oracle"], rand["self"]):
                    continue
                do, ds = s["oracle"] - rand["oracle"], s["self"] - rand["self"]
                print(f"| {model} | {K} | {what} | {do:+.3f} | {ds:+.3f} | {'yes' if do > 0 and ds > 0 else 'no'} |")
    trained = load(ws, "dpp-m5-random-k10")
    if trained and trained["self"] is not None:
        print(f"\nR-DPP m=5, 10 random samples: self-CIDEr {trained['self']:.3f}, mean CIDEr {trained['mean']:.3f}. "
              "The XE model's DPP-selected sets of 10, from it:")
        for tag, what, _ in METHODS[5:]:
            s = load(ws, f"xe-{tag.format(K=10, C=C)}")
            if s and s["self"] is not None:
                print(f"- {what}: Δ self-CIDEr {s['self'] - trained['self']:+.3f}, "
                      f"Δ mean CIDEr {s['mean'] - trained['mean']:+.3f}")

    curves = [(f"{model}, T = {c[0][2][2:]}–{c[-1][2][2:]}", c, {"color": COLOURS[label]})
              for label, model in MODELS[:2] if len(c := curve(ws, label)) >= 2]
    print("\n### Frontier: height above (+) or below (−) the temperature curves at the same self-CIDEr "
          "(10 captions per image)\n")
    print("| point | self-CIDEr | mean CIDEr | " + " | ".join(f"vs {n.split(',')[0]} curve" for n, *_ in curves)
          + " |\n|---|---|---|" + "---|" * len(curves))
    frontier = [(f"R-DPP m={m}, random", f"dpp-m{m}-random-k10") for m in DPP_MS]
    frontier += [(f"{model} {what}", f"{label}-{tag.format(K=10, C=C)}") for label, model in MODELS
                 for tag, what, _ in METHODS[3:]]
    for name, key in frontier:
        s = load(ws, key)
        if s is None or s["self"] is None or s["mean"] is None:
            continue
        cells = []
        for _, pts, _ in curves:
            h = height_above(pts, s["self"], s["mean"])
            cells.append("outside its range" if h is None else f"{round(h, 9) or 0.0:+.3f}")  # no "-0.000"
        print(f"| {name} | {s['self']:.3f} | {s['mean']:.3f} | " + " | ".join(cells) + " |")
    for n, pts, _ in curves:
        print(f"\n{n}: " + ", ".join(f"{t} ({x:.3f}, {y:.3f})" for x, y, t in pts))

    from rdpp_cli.scoring.plot import plot_points

    points, styles = [], []  # colour: the model; marker: the decoding (legend: one entry per model)
    for label, model in MODELS:
        for (tag, _, short), marker in zip(METHODS, "o^vsDP*"):
            s = load(ws, f"{label}-{tag.format(K=10, C=C)}")
            if s is not None:
                points.append((short, s["self"], s["mean"]))
                first = not any(st["color"] == COLOURS[label] for st in styles)
                styles.append({"color": COLOURS[label], "marker": marker, **({"label": model} if first else {})})
    for m in DPP_MS:
        s = load(ws, f"dpp-m{m}-random-k10")
        if s is not None and m != 5:  # m = 5 is R-DPP m=5's 'random' above
            points.append((f"m={m}", s["self"], s["mean"]))
            styles.append({"color": COLOURS["dpp"], "marker": "o", "alpha": 0.5})
    out = args.out or ws / "selection.png"
    plot_points(points, human, out, title=f"{K_PLOT} captions per image: decoders, --select from {C}, temperature curves",
                curves=curves, styles=styles)
    print(f"\nplot: {out}")


if __name__ == "__main__":
    main()
