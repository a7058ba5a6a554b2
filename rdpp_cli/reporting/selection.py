"""The tables of the set-selection sweep (docs/decoding.md#choosing-a-set---select-the-dpp-at-inference),
from the scores artifacts ``scores/sel-<model>-<tag>`` (``rdpp score --oracle --self-cider --diversity``):

1. for each K, every decoding of the XE, SCST and R-DPP m=5 models: mean CIDEr (``average``),
   oracle CIDEr (best of K), self-CIDEr, Div-2;
2. the goal: does a DPP-selected set beat random sampling of the same model at the same K on oracle
   CIDEr *and* self-CIDEr; how far the XE model's DPP sets are from R-DPP m=5's samples;
3. the frontier: for the R-DPP points (10 random samples, m = 2, 3, 5, 7) and the 10-caption sets
   chosen from C samples, the height above (+) or below (-) the temperature curves of XE and SCST
   (10 samples per image) at the same self-CIDEr: the highest of the curve's segments (between
   neighbouring temperatures) that span that self-CIDEr; "outside its range" when none does;
4. optionally the plot: x = self-CIDEr, y = mean CIDEr, the K = 10 points, the curves and the
   human point.
"""

from __future__ import annotations

import re
from pathlib import Path

from rdpp_cli.reporting.report import Block, Num, Table, Text, get, scores

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
METHODS = [("random-k{K}", "random sampling", "random"), ("beam-k{K}", "beam search (K beams)", "beam"),
           ("dbs-k{K}", "diverse beam search (K groups)", "DBS"),
           ("logprob-c{C}-k{K}", "--select logprob", "logprob"), ("mbr-c{C}-k{K}", "--select mbr", "MBR"),
           ("dpp-consensus-c{C}-k{K}", "--select dpp, consensus", "DPP-cons"),
           ("dpp-logprob-c{C}-k{K}", "--select dpp, logprob", "DPP-lp")]
SELECTED = METHODS[5:]  # the DPP selections
DPP_MS = (2, 3, 5, 7)
COLOURS = {"xe": "tab:blue", "scst": "tab:orange", "dpp-m5": "tab:green", "dpp": "tab:green"}
K_PLOT = 10  # the plot's set size: the temperature curves have 10 samples per image

Curve = tuple[str, list[tuple[float, float, str]], dict]


def load(ws: Path, name: str) -> dict | None:
    """Mean CIDEr, oracle CIDEr, self-CIDEr, Div-2 and the human point of ``scores/sel-<name>``."""
    s = scores(ws, f"sel-{name}")
    if s is None:
        return None
    return {"mean": get(s, "average", "CIDEr"), "oracle": get(s, "oracle", "CIDEr"),
            "self": get(s, "diversity", "self_cider"), "div2": get(s, "diversity", "div2"), "human": s.get("human")}


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


def per_k(ws: Path, candidates: int, ks: list[int]) -> tuple[list[Table], dict | None]:
    """One table per K; and the human point of the first artifact found."""
    tables, human = [], None
    for K in ks:
        t = Table(["model", "decoding", "mean CIDEr", "oracle CIDEr", "self-CIDEr", "Div-2"],
                  title=f"### K = {K} captions per image ({candidates} random samples as candidates for --select)")
        for label, model in MODELS:
            for tag, what, _ in METHODS:
                s = load(ws, f"{label}-{tag.format(K=K, C=candidates)}")
                if s is not None:
                    human = human or s["human"]
                    t.rows.append([model, what, *(Num(s[k]) for k in ("mean", "oracle", "self", "div2"))])
        tables.append(t)
    return tables, human


def goal(ws: Path, candidates: int, ks: list[int]) -> list[Block]:
    """DPP-selected sets against random sampling at the same K; the XE model's DPP sets of 10
    against R-DPP m=5's 10 random samples."""
    t = Table(["model", "K", "selection", "Δ oracle CIDEr", "Δ self-CIDEr", "both higher"],
              title="### Goal: a DPP-selected set beats random sampling of the same model at the same K on oracle "
                    "CIDEr and self-CIDEr")
    for K in ks:
        for label, model in MODELS:
            rand = load(ws, f"{label}-random-k{K}")
            for tag, what, _ in SELECTED:
                s = load(ws, f"{label}-{tag.format(K=K, C=candidates)}")
                if s is None or rand is None or None in (s["oracle"], s["self"], rand["oracle"], rand["self"]):
                    continue
                do, ds = s["oracle"] - rand["oracle"], s["self"] - rand["self"]
                t.rows.append([model, Num(K, "d"), what, Num(do, "+.3f"), Num(ds, "+.3f"),
                               "yes" if do > 0 and ds > 0 else "no"])
    blocks: list[Block] = [t]
    trained = load(ws, "dpp-m5-random-k10")
    if trained and trained["self"] is not None:
        lines = [f"R-DPP m=5, 10 random samples: self-CIDEr {trained['self']:.3f}, mean CIDEr {trained['mean']:.3f}. "
                 "The XE model's DPP-selected sets of 10, from it:"]
        for tag, what, _ in SELECTED:
            s = load(ws, f"xe-{tag.format(K=10, C=candidates)}")
            if s and s["self"] is not None:
                lines.append(f"- {what}: Δ self-CIDEr {s['self'] - trained['self']:+.3f}, "
                             f"Δ mean CIDEr {s['mean'] - trained['mean']:+.3f}")
        blocks.append(Text(lines))
    return blocks


def curves(ws: Path) -> list[Curve]:
    """The temperature curves of XE and SCST (those with two points or more), with their colour."""
    return [(f"{model}, T = {c[0][2][2:]}–{c[-1][2][2:]}", c, {"color": COLOURS[label]})
            for label, model in MODELS[:2] if len(c := curve(ws, label)) >= 2]


def frontier(ws: Path, candidates: int, drawn: list[Curve]) -> list[Block]:
    """The height of the R-DPP points and the 10-caption selections above each curve, then the curves."""
    t = Table(["point", "self-CIDEr", "mean CIDEr", *(f"vs {n.split(',')[0]} curve" for n, *_ in drawn)],
              title="### Frontier: height above (+) or below (−) the temperature curves at the same self-CIDEr "
                    "(10 captions per image)")
    points = [(f"R-DPP m={m}, random", f"dpp-m{m}-random-k10") for m in DPP_MS]
    points += [(f"{model} {what}", f"{label}-{tag.format(K=10, C=candidates)}") for label, model in MODELS
               for tag, what, _ in METHODS[3:]]
    for name, key in points:
        s = load(ws, key)
        if s is None or s["self"] is None or s["mean"] is None:
            continue
        cells = []
        for _, pts, _ in drawn:
            h = height_above(pts, s["self"], s["mean"])
            cells.append("outside its range" if h is None else Num(round(h, 9) or 0.0, "+.3f"))  # no "-0.000"
        t.rows.append([name, Num(s["self"]), Num(s["mean"]), *cells])
    return [t, *(Text([f"{n}: " + ", ".join(f"{lbl} ({x:.3f}, {y:.3f})" for x, y, lbl in pts)]) for n, pts, _ in drawn)]


def selection(ws: Path, candidates: int = 50, ks: list[int] | tuple[int, ...] = (5, 10),
              plot: Path | None = None) -> list[Block]:
    """Every table of the selection sweep; with ``plot``, also the plane of the K = 10 points."""
    tables, human = per_k(ws, candidates, list(ks))
    drawn = curves(ws)
    blocks = [*tables, *goal(ws, candidates, list(ks)), *frontier(ws, candidates, drawn)]
    if plot is not None:
        draw(ws, candidates, drawn, human, plot)
        blocks.append(Text([f"plot: {plot}"]))
    return blocks


def draw(ws: Path, candidates: int, drawn: list[Curve], human: dict | None, out: Path) -> Path:
    """The plot: colour the model, marker the decoding (one legend entry per model), the R-DPP
    points m = 2, 3, 7 lighter, the temperature curves and the human point."""
    from rdpp_cli.scoring.plot import plot_points

    points, styles = [], []
    for label, model in MODELS:
        for (tag, _, short), marker in zip(METHODS, "o^vsDP*"):
            s = load(ws, f"{label}-{tag.format(K=K_PLOT, C=candidates)}")
            if s is not None:
                points.append((short, s["self"], s["mean"]))
                first = not any(st["color"] == COLOURS[label] for st in styles)
                styles.append({"color": COLOURS[label], "marker": marker, **({"label": model} if first else {})})
    for m in DPP_MS:
        s = load(ws, f"dpp-m{m}-random-k10")
        if s is not None and m != 5:  # m = 5 is R-DPP m=5's 'random' above
            points.append((f"m={m}", s["self"], s["mean"]))
            styles.append({"color": COLOURS["dpp"], "marker": "o", "alpha": 0.5})
    title = f"{K_PLOT} captions per image: decoders, --select from {candidates}, temperature curves"
    return plot_points(points, human, out, title=title, curves=drawn, styles=styles)
