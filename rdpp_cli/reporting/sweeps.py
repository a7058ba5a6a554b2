"""The tables of the training sweeps on the bundled data (docs/scoring.md#comparison-tables).

Each reads the artifacts by the folder names ``examples/sweep.sh`` gives them:

- ``toy``: the paper's Table 1 (``scores/<model>-beam3``), Table 2 (oracle of ``-random10`` and
  ``-random20``), Fig. 1's columns (``-random10``) and the results table (greedy CIDEr of
  ``-greedy``; mean, oracle, self-CIDEr, distinct, Div-2, mBLEU-4 and bad endings of ``-random10``);
- ``objective``: XE, SCST and R-DPP m = 2, 5 with two seeds (``<model>`` and ``<model>-s7``), and
  the checks on the seed means; with a second workspace each cell shows "theirs → this";
- ``precision``: every ``xe-<precision>-s<seed>`` run and the fine-tunes from it, the mean over
  seeds, and bf16 minus fp32;
- ``models``: for every model ``<tag>`` of a complete ``xe/xe-<tag>``, its XE, SCST and R-DPP m=5 runs
  (``xe/xe-<tag>``, ``finetune/scst-<tag>``, ``finetune/dpp-m5-<tag>``, scored as ``-random10``) and the
  trade-off: R-DPP m=5 against SCST per model.
"""

from __future__ import annotations

import math
from pathlib import Path

from rdpp_cli.errors import RdppError
from rdpp_cli.models.registry import DEFAULT_MODEL, model_spec
from rdpp_cli.reporting.report import Block, Cell, Num, Table, Text, bad_endings, get, last_time, read_json, scores

# ---- toy ----------------------------------------------------------------------------------------------

TOY_MODELS = [("xe", f"{model_spec(DEFAULT_MODEL).title}-XE"), ("scst", "SCST"), ("scst-mean", "SCST, mean baseline"), ("xe-cider", "XE+5CIDEr"),
              ("dpp-m2", "R-DPP (m=2)"), ("dpp-m3", "R-DPP (m=3)"), ("dpp-m5", "R-DPP (m=5)"),
              ("dpp-m7", "R-DPP (m=7)"), ("dpp-m5-mean", "R-DPP (m=5), mean baseline")]
COCO_METRICS = [("Bleu_4", "B-4"), ("METEOR", "M"), ("ROUGE_L", "R"), ("CIDEr", "C")]


def _present(ws: Path, tag: str) -> list[tuple[str, str]]:
    return [(n, label) for n, label in TOY_MODELS if (ws / "scores" / f"{n}-{tag}").is_dir()]


def toy(ws: Path) -> list[Block]:
    """The paper's Table 1, Table 2 and Fig. 1 columns, then the results table."""
    rows = _present(ws, "beam3")
    t1 = Table(["model", "bw", "B-4", "M", "R", "C", "S"],
               title="Table 1: one caption per test image by beam search (bw 3), coco-caption")
    t2 = Table(["model", "#", "B-4", "M", "R", "C"],
               title="Table 2: oracle (best of # random samples per image, mean over images)")
    fig1 = Table(["model", "mean CIDEr", "self-CIDEr", "Div-2", "mBLEU-4"],
                 title="Fig. 1: 10 random samples per test image")
    for name, label in rows:
        acc = get(scores(ws, f"{name}-beam3"), "accuracy")
        t1.rows.append([label, Num(3, "d"), *(Num(get(acc, k)) for k, _ in COCO_METRICS), Num(get(acc, "SPICE"))])
    for name, label in rows:
        for n in (10, 20):
            orc = get(scores(ws, f"{name}-random{n}"), "oracle")
            t2.rows.append([label, Num(n, "d"), *(Num(get(orc, k)) for k, _ in COCO_METRICS)])
    for name, label in rows:
        s = scores(ws, f"{name}-random10")
        fig1.rows.append([label, *(Num(get(s, *k)) for k in (("average", "CIDEr"), ("diversity", "self_cider"),
                                                                ("diversity", "div2"), ("diversity", "mbleu4")))])
    return [t1, t2, fig1, results(ws)]


def results(ws: Path) -> Table:
    """Greedy CIDEr, and over 10 random samples per test image the mean and oracle CIDEr,
    self-CIDEr, distinct captions, Div-2, mBLEU-4 and the share that ends badly."""
    table = Table(["model", "greedy CIDEr", "mean sample CIDEr", "oracle CIDEr (best of 10)", "self-CIDEr",
                   "distinct / 10", "Div-2", "mBLEU-4", "bad endings"],
                  title="Results: greedy caption, and 10 random samples per test image")
    for name, label in _present(ws, "random10"):
        s = scores(ws, f"{name}-random10")
        div = get(s, "diversity")
        table.rows.append([
            label, Num(get(scores(ws, f"{name}-greedy"), "accuracy", "CIDEr")), Num(get(s, "accuracy", "CIDEr")),
            Num(get(s, "oracle", "CIDEr")), Num(get(div, "self_cider")), Num(get(div, "distinct"), ".2f"),
            Num(get(div, "div2")), Num(get(div, "mbleu4")), Num(bad_endings(ws, f"{name}-random10"), ".1%")])
    return table


# ---- objective: two seeds, optionally against another workspace ---------------------------------------

OBJECTIVE_MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m2", "R-DPP m=2"), ("dpp-m5", "R-DPP m=5")]
SEEDS = (123, 7)  # seed 123's runs carry the model's name, the others "-s<seed>"
DIVERSITY_GAIN = 1.5  # docs/experiments.md: R-DPP m=5's self-CIDEr at least 1.5x SCST's
OBJECTIVE_COLS = ("greedy", "mean", "oracle", "self_cider", "bad_ending")


def objective_row(ws: Path, name: str) -> dict[str, float] | None:
    """The numbers of one run: greedy CIDEr, and of 10 random samples mean and oracle CIDEr,
    self-CIDEr and the bad-ending share; None unless all three artifacts are there."""
    g, r = scores(ws, f"{name}-greedy"), scores(ws, f"{name}-random10")
    bad = bad_endings(ws, f"{name}-random10")
    if g is None or r is None or bad is None:
        return None
    return {"greedy": g["accuracy"]["CIDEr"], "mean": r["accuracy"]["CIDEr"], "oracle": r["oracle"]["CIDEr"],
            "self_cider": r["diversity"]["self_cider"], "bad_ending": bad}


def _cell(old: dict | None, new: dict, key: str) -> Cell:
    spec = ".1%" if key == "bad_ending" else ".3f"
    return f"{old[key]:{spec}} → {new[key]:{spec}}" if old else Num(new[key], spec)


def objective(ws: Path, against: Path | None = None) -> list[Block]:
    """One row per run; with ``against`` each cell is "against's → ws's". Then the checks of
    docs/experiments.md on ``ws``'s seed means."""
    import numpy as np

    table = Table(["model", "seed", "greedy CIDEr", "mean sample CIDEr", "oracle (best of 10)", "self-CIDEr",
                   "bad endings"])
    means = {}
    for model, label in OBJECTIVE_MODELS:
        seeds = SEEDS[:1] if model == "xe" else SEEDS
        found = []
        for seed in seeds:
            name = model if seed == SEEDS[0] else f"{model}-s{seed}"
            new = objective_row(ws, name)
            if new is None:
                continue
            old = objective_row(against, name) if against else None
            table.rows.append([label, Num(seed, "d"), *(_cell(old, new, k) for k in OBJECTIVE_COLS)])
            found.append(new)
        if found:
            means[model] = {k: float(np.mean([r[k] for r in found])) for k in OBJECTIVE_COLS}
    blocks: list[Block] = [table]
    if {"xe", "scst", "dpp-m5"} <= set(means):
        xe, scst, dpp = means["xe"], means["scst"], means["dpp-m5"]
        blocks.append(Text([
            "Checks on the seed means (--workspace):",
            f"- R-DPP m=5 self-CIDEr / SCST's = {dpp['self_cider'] / scst['self_cider']:.2f} (≥ {DIVERSITY_GAIN})",
            f"- R-DPP m=5 oracle {dpp['oracle']:.3f} vs SCST {scst['oracle']:.3f} (≥)",
            f"- R-DPP m=5 mean sample CIDEr / XE's = {dpp['mean'] / xe['mean']:.2f} (≥ 1.1)"]))
    return blocks


# ---- precision: fp32 against bf16 ---------------------------------------------------------------------

PRECISION_MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_COLS = ["val CIDEr-D", "greedy CIDEr", "mean sample CIDEr", "oracle CIDEr (10)", "self-CIDEr", "train s"]
TOLERANCE = 0.03  # docs/training.md: bf16 within ±0.03 greedy val CIDEr-D of fp32


def precision_run(ws: Path, name: str) -> dict[str, float]:
    """The numbers of one run ``name`` (e.g. dpp-m5-bf16-s123); NaN for what is not there yet:
    best greedy val CIDEr-D (the model's manifest), training time (metrics.csv), and on the test
    split the greedy caption's CIDEr and 10 random samples' mean, oracle and self-CIDEr."""
    model = ws / ("xe" if name.startswith("xe-") else "finetune") / name
    greedy, rand = scores(ws, f"{name}-greedy"), scores(ws, f"{name}-random10")
    numbers = [get(read_json(model / "manifest.json"), "summary", "val_cider"), get(greedy, "accuracy", "CIDEr"),
               get(rand, "average", "CIDEr"), get(rand, "oracle", "CIDEr"), get(rand, "diversity", "self_cider"),
               last_time(model / "metrics.csv")]
    return {c: math.nan if v is None else float(v) for c, v in zip(PRECISION_COLS, numbers)}


def precision_runs(ws: Path) -> list[dict]:
    """Every run of the precision sweep in ``ws``, by model, precision and seed."""
    runs = []
    for d in sorted([*(ws / "xe").glob("xe-*"), *(ws / "finetune").glob("*")]):
        for k, (key, label) in enumerate(PRECISION_MODELS):
            for p, prec in enumerate(PRECISIONS):
                seed = d.name.removeprefix(f"{key}-{prec}-s")
                if d.name.startswith(f"{key}-{prec}-s") and seed.isdigit():
                    runs.append({"model": label, "precision": prec, "seed": int(seed), "order": (k, p, int(seed)),
                                 **precision_run(ws, d.name)})
    return sorted(runs, key=lambda r: r["order"])


def _nanmean(values: list[float]) -> float:
    import numpy as np

    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def _precision_table(rows: list[dict], keys: list[str], title: str) -> Table:
    spec = {"train s": ".0f", "seed": "d"}
    return Table(keys, [[r[k] if isinstance(r[k], str) else Num(r[k], spec.get(k, ".3f")) for k in keys] for r in rows],
                 title=title)


def precision(ws: Path) -> list[Block]:
    """Per run, the mean over seeds of each (model, precision), and bf16 minus fp32."""
    runs = precision_runs(ws)
    if not runs:
        raise RdppError(f"no runs of the precision sweep in {ws} (xe/xe-<precision>-s<seed>, finetune/...); "
                        "make them with `bash examples/sweep.sh precision` or pass its --workspace")
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["model"], r["precision"]), []).append(r)
    mean = [{"model": m, "precision": p, **{c: _nanmean([r[c] for r in rs]) for c in PRECISION_COLS}}
            for (m, p), rs in groups.items()]
    blocks: list[Block] = [
        _precision_table(runs, ["model", "precision", "seed", *PRECISION_COLS], f"Per run ({ws})"),
        _precision_table(mean, ["model", "precision", *PRECISION_COLS], "Mean over seeds")]
    diff = _bf16_minus_fp32(mean)
    if diff.rows:
        blocks.append(diff)
    return blocks


def _bf16_minus_fp32(mean: list[dict]) -> Table:
    check = f"|Δ val| ≤ {TOLERANCE}"
    cols = [f"Δ {c}" for c in PRECISION_COLS[:-1]] + ["fp32 s / bf16 s", check]
    table = Table(["model", *cols], title="bf16 minus fp32 (means over seeds), and the ±0.03 check on greedy val "
                                          "CIDEr-D")
    by = {(m["model"], m["precision"]): m for m in mean}
    for _, label in PRECISION_MODELS:
        a, b = by.get((label, "fp32")), by.get((label, "bf16"))
        if a is None or b is None:
            continue
        diff = [b[c] - a[c] for c in PRECISION_COLS[:-1]]
        ratio = a["train s"] / b["train s"] if b["train s"] else math.nan  # fp32 time / bf16 time
        ok = "–" if not math.isfinite(diff[0]) else "yes" if abs(diff[0]) <= TOLERANCE else "no"
        table.rows.append([label, *(Num(v) for v in diff), Num(ratio), ok])
    return table


# ---- models: XE, SCST and R-DPP m=5 of every model ----------------------------------------------------

MODEL_RUNS = [("xe", "xe", "XE"), ("finetune", "scst", "SCST"), ("finetune", "dpp-m5", "R-DPP m=5")]
MODEL_COLS = [("mean sample CIDEr", ("average", "CIDEr")), ("oracle CIDEr (best of 10)", ("oracle", "CIDEr")),
              ("self-CIDEr", ("diversity", "self_cider")), ("Div-2", ("diversity", "div2"))]


def model_tags(ws: Path) -> list[str]:
    """The models of the models sweep in ``ws``: the ``<tag>`` of every complete ``xe/xe-<tag>``."""
    return sorted(d.name.removeprefix("xe-") for d in (ws / "xe").glob("xe-?*") if (d / "manifest.json").is_file())


def model_label(ws: Path, tag: str) -> str:
    """The model's name as its runs' manifests record it (``config.architecture``), with the folders'
    tag beside it where the two differ."""
    archs = [get(read_json(ws / group / f"{run}-{tag}" / "manifest.json"), "config", "architecture")
             for group, run, _ in MODEL_RUNS]
    arch = next((a for a in archs if a), tag)
    return arch if arch == tag else f"{arch} ({tag})"


def model_runs(ws: Path, tag: str) -> list[dict]:
    """One dict per run of model ``tag`` that is there (its model artifact or its scores): the
    objective's label, the four numbers of 10 random captions per test image (None where not
    scored yet) and the run's training seconds (the last ``time`` of its metrics.csv)."""
    runs = []
    for group, run, label in MODEL_RUNS:
        name, model = f"{run}-{tag}", ws / group / f"{run}-{tag}"
        s = scores(ws, f"{name}-random10")
        if s is None and not (model / "manifest.json").is_file():
            continue
        runs.append({"run": run, "objective": label, **{c: get(s, *k) for c, k in MODEL_COLS},
                     "train s": last_time(model / "metrics.csv")})
    return runs


def models(ws: Path) -> list[Block]:
    """Every model's XE, SCST and R-DPP m=5 runs, then per model the trade-off: R-DPP m=5's
    self-CIDEr over SCST's, and the differences of its oracle and mean CIDEr, and the models on
    which R-DPP's diversity gain (self-CIDEr at least ``DIVERSITY_GAIN`` x SCST's) appears."""
    table = Table(["model", "objective", *(c for c, _ in MODEL_COLS), "train s"], align="llrrrrr",
                  title="10 random captions per test image")
    trade = Table(["model", "self-CIDEr R-DPP / SCST", "Δ oracle CIDEr (R-DPP − SCST)", "Δ mean CIDEr (R-DPP − SCST)",
                   f"diversity gain (≥ {DIVERSITY_GAIN}×)"], align="lrrrl",
                  title="The trade-off per model: R-DPP m=5 against SCST")
    gain, none = [], []
    for tag in model_tags(ws):
        label, runs = model_label(ws, tag), model_runs(ws, tag)
        for r in runs:
            table.rows.append([label, r["objective"], *(Num(r[c]) for c, _ in MODEL_COLS),
                               Num(None if math.isnan(r["train s"]) else r["train s"], ",.0f")])
        ratio = _trade_off(runs)
        if ratio is None:
            continue
        (gain if ratio[0] >= DIVERSITY_GAIN else none).append(f"{label} ({ratio[0]:.2f}×)")
        trade.rows.append([label, Num(ratio[0], ".2f"), Num(ratio[1], "+.3f"), Num(ratio[2], "+.3f"),
                           "yes" if ratio[0] >= DIVERSITY_GAIN else "no"])
    blocks: list[Block] = [table]
    if trade.rows:
        blocks += [trade, Text([f"R-DPP m=5's diversity gain (self-CIDEr ≥ {DIVERSITY_GAIN}× SCST's) appears on: "
                                f"{', '.join(gain) or 'none'}; not on: {', '.join(none) or 'none'}."])]
    return blocks


def _trade_off(runs: list[dict]) -> tuple[float, float, float] | None:
    """R-DPP m=5's self-CIDEr / SCST's, and its oracle and mean CIDEr minus SCST's; None unless both
    runs have all three numbers (and SCST's self-CIDEr is not 0)."""
    by = {r["run"]: r for r in runs}
    scst, dpp = by.get(MODEL_RUNS[1][1]), by.get(MODEL_RUNS[2][1])
    keys = ("self-CIDEr", "oracle CIDEr (best of 10)", "mean sample CIDEr")
    if scst is None or dpp is None or any(r[k] is None for r in (scst, dpp) for k in keys) or not scst[keys[0]]:
        return None
    return dpp[keys[0]] / scst[keys[0]], dpp[keys[1]] - scst[keys[1]], dpp[keys[2]] - scst[keys[2]]
