"""`rdpp table` (rdpp_cli.reporting): the comparison tables of the sweeps and the real-photo run, from
hand-made artifact files whose numbers the expected tables quote."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import error_line, rdpp

from rdpp_cli.errors import RdppError
from rdpp_cli.reporting.report import Num, Table, Text, markdown, to_csv
from rdpp_cli.reporting.selection import height_above
from rdpp_cli.reporting.table import table


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _scores(ws: Path, name: str, **sections) -> None:
    _write(ws / "scores" / name / "scores.json", sections)


def _samples(ws: Path, name: str, captions: list[list[str]]) -> None:
    _write(ws / "samples" / name / "samples.json",
           [{"image_id": 100 + i, "captions": c, "logprobs": [-1.0] * len(c)} for i, c in enumerate(captions)])


def _md(capsys, *args, **kwargs) -> str:
    table(*args, **kwargs)
    return capsys.readouterr().out


# ---- toy ----------------------------------------------------------------------------------------------

def _toy_workspace(ws: Path) -> None:
    _scores(ws, "xe-beam3", accuracy={"Bleu_4": 0.25, "METEOR": 0.2, "ROUGE_L": 0.5, "CIDEr": 0.8, "SPICE": 0.15})
    _scores(ws, "xe-random10", accuracy={"CIDEr": 0.6}, average={"CIDEr": 0.55},
            oracle={"Bleu_4": 0.4, "METEOR": 0.3, "ROUGE_L": 0.6, "CIDEr": 1.2},
            diversity={"self_cider": 0.3, "div2": 0.25, "mbleu4": 0.7, "distinct": 4.5})
    _scores(ws, "xe-random20", oracle={"Bleu_4": 0.45, "METEOR": 0.31, "ROUGE_L": 0.62, "CIDEr": 1.35})
    _scores(ws, "xe-greedy", accuracy={"CIDEr": 0.85})
    # image 1: "a" ends badly, "dog" does not -> 1/2; image 2: "cat" no, "of" and "The" (lowercased) yes -> 2/3
    _samples(ws, "xe-random10", [["a man on a", "a dog"], ["the cat", "a cat of", "Two Birds The"]])
    _scores(ws, "dpp-m5-beam3", accuracy={"Bleu_4": 0.2, "METEOR": 0.18, "ROUGE_L": 0.45, "CIDEr": 0.7})  # no SPICE
    _scores(ws, "dpp-m5-random10", accuracy={"CIDEr": 0.9}, average={"CIDEr": 0.85},
            oracle={"Bleu_4": 0.35, "METEOR": 0.33, "ROUGE_L": 0.64, "CIDEr": 1.5},
            diversity={"self_cider": 0.8, "div2": 0.5, "mbleu4": 0.3, "distinct": 8.25})  # no -random20, -greedy


TOY = """\
Table 1: one caption per test image by beam search (bw 3), coco-caption

| model | bw | B-4 | M | R | C | S |
|---|---|---|---|---|---|---|
| Att2in-XE | 3 | 0.250 | 0.200 | 0.500 | 0.800 | 0.150 |
| R-DPP (m=5) | 3 | 0.200 | 0.180 | 0.450 | 0.700 | – |

Table 2: oracle (best of # random samples per image, mean over images)

| model | # | B-4 | M | R | C |
|---|---|---|---|---|---|
| Att2in-XE | 10 | 0.400 | 0.300 | 0.600 | 1.200 |
| Att2in-XE | 20 | 0.450 | 0.310 | 0.620 | 1.350 |
| R-DPP (m=5) | 10 | 0.350 | 0.330 | 0.640 | 1.500 |
| R-DPP (m=5) | 20 | – | – | – | – |

Fig. 1: 10 random samples per test image

| model | mean CIDEr | self-CIDEr | Div-2 | mBLEU-4 |
|---|---|---|---|---|
| Att2in-XE | 0.550 | 0.300 | 0.250 | 0.700 |
| R-DPP (m=5) | 0.850 | 0.800 | 0.500 | 0.300 |

Results: greedy caption, and 10 random samples per test image

| model | greedy CIDEr | mean sample CIDEr | oracle CIDEr (best of 10) | self-CIDEr | distinct / 10 | Div-2 | mBLEU-4 \
| bad endings |
|---|---|---|---|---|---|---|---|---|
| Att2in-XE | 0.850 | 0.600 | 1.200 | 0.300 | 4.50 | 0.250 | 0.700 | 58.3% |
| R-DPP (m=5) | – | 0.900 | 1.500 | 0.800 | 8.25 | 0.500 | 0.300 | – |
"""


@pytest.mark.integration
def test_toy_tables_quote_the_scores_files(tmp_path, capsys):
    """The paper's Tables 1-2, Fig. 1's columns and the results table, as the toy sweep prints them
    (the same Markdown as the sweep's former table script); "–" where an artifact or metric is missing;
    bad endings (1/2 + 2/3) / 2 = 58.3% from samples.json."""
    _toy_workspace(tmp_path)
    assert _md(capsys, "toy", workspace=tmp_path) == TOY


@pytest.mark.integration
def test_csv_keeps_every_digit_and_rich_prints_every_row(tmp_path, capsys):
    _toy_workspace(tmp_path)
    table("toy", workspace=tmp_path, format="csv")
    chunks = capsys.readouterr().out.split("\n\n")
    assert [c.splitlines()[0] for c in chunks] == ["# Table 1: one caption per test image by beam search (bw 3), "
                                                   "coco-caption", "# Table 2: oracle (best of # random samples per "
                                                   "image, mean over images)", "# Fig. 1: 10 random samples per test "
                                                   "image", "# Results: greedy caption, and 10 random samples per "
                                                   "test image"]
    results = list(csv.DictReader(io.StringIO(chunks[3].split("\n", 1)[1])))
    assert results[0]["bad endings"] == repr((1 / 2 + 2 / 3) / 2) and results[0]["distinct / 10"] == "4.5"
    assert results[1]["greedy CIDEr"] == "" and results[1]["oracle CIDEr (best of 10)"] == "1.5"
    table("toy", workspace=tmp_path, format="rich")
    out = capsys.readouterr().out
    assert "58.3%" in out and "Att2in-XE" in out and "8.25" in out and "|---" not in out


@pytest.mark.unit
def test_markdown_and_csv_of_hand_made_blocks():
    blocks = [Table(["a", "b"], [["x", Num(0.12345)], ["y", Num(None)]], title="### T", align="lr"),
              Text(["note 1", "note 2"]), Table(["c"], [[Num(-0.25, "+.1%")]])]
    assert markdown(blocks) == ("### T\n\n| a | b |\n|---|---:|\n| x | 0.123 |\n| y | – |\n\nnote 1\nnote 2\n\n"
                                "| c |\n|---|\n| -25.0% |\n")
    assert to_csv(blocks) == "# T\na,b\nx,0.12345\ny,\n\nc\n-0.25\n"


# ---- objective ----------------------------------------------------------------------------------------

def _run(ws: Path, name: str, greedy: float, mean: float, oracle: float, self_cider: float, caps: list[list[str]]):
    _scores(ws, f"{name}-greedy", accuracy={"CIDEr": greedy})
    _scores(ws, f"{name}-random10", accuracy={"CIDEr": mean}, oracle={"CIDEr": oracle},
            diversity={"self_cider": self_cider})
    _samples(ws, f"{name}-random10", caps)


@pytest.mark.integration
def test_objective_table_seed_means_and_the_comparison_with_another_workspace(tmp_path, capsys):
    new, old = tmp_path / "new", tmp_path / "old"
    _run(new, "xe", 0.5, 0.4, 1.0, 0.2, [["a dog"]])
    _run(new, "scst", 1.0, 0.9, 1.1, 0.1, [["a dog on", "a dog"]])
    _run(new, "scst-s7", 1.2, 1.1, 1.3, 0.3, [["the"]])
    _run(new, "dpp-m5", 0.9, 0.6, 1.4, 0.35, [["x y", "x y", "x of", "z"]])
    _run(new, "dpp-m5-s7", 0.8, 0.4, 1.6, 0.45, [["a"]])
    _run(old, "xe", 0.45, 0.35, 0.9, 0.15, [["a dog of", "dog"]])
    out = _md(capsys, "objective", workspace=new, against=old)
    assert out == """\
| model | seed | greedy CIDEr | mean sample CIDEr | oracle (best of 10) | self-CIDEr | bad endings |
|---|---|---|---|---|---|---|
| XE | 123 | 0.450 → 0.500 | 0.350 → 0.400 | 0.900 → 1.000 | 0.150 → 0.200 | 50.0% → 0.0% |
| SCST | 123 | 1.000 | 0.900 | 1.100 | 0.100 | 50.0% |
| SCST | 7 | 1.200 | 1.100 | 1.300 | 0.300 | 100.0% |
| R-DPP m=5 | 123 | 0.900 | 0.600 | 1.400 | 0.350 | 25.0% |
| R-DPP m=5 | 7 | 0.800 | 0.400 | 1.600 | 0.450 | 100.0% |

Checks on the seed means (--workspace):
- R-DPP m=5 self-CIDEr / SCST's = 2.00 (≥ 1.5)
- R-DPP m=5 oracle 1.500 vs SCST 1.200 (≥)
- R-DPP m=5 mean sample CIDEr / XE's = 1.25 (≥ 1.1)
"""


# ---- precision ----------------------------------------------------------------------------------------

def _xe_run(ws: Path, tag: str, val: float, time: float | None, greedy: float | None) -> None:
    d = ws / "xe" / f"xe-{tag}"
    _write(d / "manifest.json", {"kind": "rdpp.model", "summary": {"val_cider": val}})
    if time is not None:
        (d / "metrics.csv").write_text(f"epoch,time,val_cider\n1,{time / 2},0.1\n2,{time},{val}\n")
    if greedy is not None:
        _scores(ws, f"xe-{tag}-greedy", accuracy={"CIDEr": greedy})


@pytest.mark.integration
def test_precision_tables_mean_over_seeds_skip_what_is_missing(tmp_path, capsys):
    """Seeds sort as numbers (2 before 10); a run's missing number is NaN in its row and left out of
    the mean over seeds (fp32's greedy mean is seed 2's 0.6; bf16's time is seed 2's 50); bf16
    minus fp32: val 0.515 - 0.510 = 0.005 (within 0.03), time ratio 110 / 50."""
    _xe_run(tmp_path, "fp32-s2", 0.50, 100, 0.6)
    _xe_run(tmp_path, "fp32-s10", 0.52, 120, None)
    _xe_run(tmp_path, "bf16-s2", 0.49, 50, 0.7)
    _xe_run(tmp_path, "bf16-s10", 0.54, None, 0.8)
    assert _md(capsys, "precision", workspace=tmp_path) == f"""\
Per run ({tmp_path})

| model | precision | seed | val CIDEr-D | greedy CIDEr | mean sample CIDEr | oracle CIDEr (10) | self-CIDEr | train s |
|---|---|---|---|---|---|---|---|---|
| XE | fp32 | 2 | 0.500 | 0.600 | nan | nan | nan | 100 |
| XE | fp32 | 10 | 0.520 | nan | nan | nan | nan | 120 |
| XE | bf16 | 2 | 0.490 | 0.700 | nan | nan | nan | 50 |
| XE | bf16 | 10 | 0.540 | 0.800 | nan | nan | nan | nan |

Mean over seeds

| model | precision | val CIDEr-D | greedy CIDEr | mean sample CIDEr | oracle CIDEr (10) | self-CIDEr | train s |
|---|---|---|---|---|---|---|---|
| XE | fp32 | 0.510 | 0.600 | nan | nan | nan | 110 |
| XE | bf16 | 0.515 | 0.750 | nan | nan | nan | 50 |

bf16 minus fp32 (means over seeds), and the ±0.03 check on greedy val CIDEr-D

| model | Δ val CIDEr-D | Δ greedy CIDEr | Δ mean sample CIDEr | Δ oracle CIDEr (10) | Δ self-CIDEr | fp32 s / bf16 s \
| |Δ val| ≤ 0.03 |
|---|---|---|---|---|---|---|---|
| XE | 0.005 | 0.150 | nan | nan | nan | 2.200 | yes |
"""


# ---- models -------------------------------------------------------------------------------------------

def _model_run(ws: Path, run: str, tag: str, arch: str | None, numbers: tuple | None, time: float | None = None):
    """The artifacts of one run of the models sweep: ``xe/xe-<tag>`` or ``finetune/<run>-<tag>`` (its
    manifest naming ``arch``, optionally a metrics.csv) and ``scores/<run>-<tag>-random10`` with
    (mean, oracle, self-CIDEr, Div-2)."""
    d = ws / ("xe" if run == "xe" else "finetune") / f"{run}-{tag}"
    if arch is not None:
        _write(d / "manifest.json", {"kind": "rdpp.model", "config": {"architecture": arch}})
    if time is not None:
        (d / "metrics.csv").write_text(f"epoch,time\n1,{time / 2}\n2,{time}\n")
    if numbers is not None:
        mean, oracle, self_cider, div2 = numbers
        _scores(ws, f"{run}-{tag}-random10", accuracy={"CIDEr": mean}, average={"CIDEr": mean},
                oracle={"CIDEr": oracle}, diversity={"self_cider": self_cider, "div2": div2})


def _models_workspace(ws: Path) -> None:
    # a model whose R-DPP gain appears: self-CIDEr 0.70 / 0.25 = 2.8x
    _model_run(ws, "xe", "att2in", "att2in", (0.84, 2.0, 0.83, 0.55), time=1041)
    _model_run(ws, "scst", "att2in", "att2in", (1.6, 1.955, 0.25, 0.145), time=949)
    _model_run(ws, "dpp-m5", "att2in", "att2in", (1.118, 2.19, 0.70, 0.438), time=934)
    # names the code has never heard of, and a folder tag that is not the architecture: 0.36 / 0.30 = 1.2x
    _model_run(ws, "xe", "mynet-big", "mynet", (0.5, 1.5, 0.6, 0.4))
    _model_run(ws, "scst", "mynet-big", "mynet", (1.2, 1.5, 0.30, 0.2))
    _model_run(ws, "dpp-m5", "mynet-big", None, (1.0, 1.6, 0.36, 0.25))  # scored, model folder gone
    # still training: XE done and not scored yet, SCST not started
    _model_run(ws, "xe", "late", "late", None, time=10)
    # not the models sweep's: a finetune without its xe/xe-<tag>, and the toy sweep's xe/xe
    _model_run(ws, "scst", "orphan", "att2in", (1.0, 1.0, 1.0, 1.0))
    _model_run(ws, "xe", "", "att2in", None)  # xe/xe- is not a model tag ...
    _write(ws / "xe" / "xe" / "manifest.json", {"config": {"architecture": "att2in"}})  # ... nor is xe/xe


MODELS_TABLE = """\
10 random captions per test image

| model | objective | mean sample CIDEr | oracle CIDEr (best of 10) | self-CIDEr | Div-2 | train s |
|---|---|---:|---:|---:|---:|---:|
| att2in | XE | 0.840 | 2.000 | 0.830 | 0.550 | 1,041 |
| att2in | SCST | 1.600 | 1.955 | 0.250 | 0.145 | 949 |
| att2in | R-DPP m=5 | 1.118 | 2.190 | 0.700 | 0.438 | 934 |
| late | XE | – | – | – | – | 10 |
| mynet (mynet-big) | XE | 0.500 | 1.500 | 0.600 | 0.400 | – |
| mynet (mynet-big) | SCST | 1.200 | 1.500 | 0.300 | 0.200 | – |
| mynet (mynet-big) | R-DPP m=5 | 1.000 | 1.600 | 0.360 | 0.250 | – |

The trade-off per model: R-DPP m=5 against SCST

| model | self-CIDEr R-DPP / SCST | Δ oracle CIDEr (R-DPP − SCST) | Δ mean CIDEr (R-DPP − SCST) | diversity gain (≥ 1.5×) |
|---|---:|---:|---:|---|
| att2in | 2.80 | +0.235 | -0.482 | yes |
| mynet (mynet-big) | 1.20 | +0.100 | -0.200 | no |

R-DPP m=5's diversity gain (self-CIDEr ≥ 1.5× SCST's) appears on: att2in (2.80×); not on: mynet (mynet-big) (1.20×).
"""


@pytest.mark.integration
def test_models_table_one_row_per_run_and_the_trade_off_per_model(tmp_path, capsys):
    """Rows for every model of a complete xe/xe-<tag>, labelled by the manifests' architecture, in
    the order of the tags; a run's numbers from its -random10 scores ("–" until scored) and its
    training seconds from metrics.csv; the trade-off and the gain line for the models with both
    SCST and R-DPP m=5 scored (2.80 = 0.70 / 0.25, +0.235 = 2.190 - 1.955, -0.482 = 1.118 - 1.6)."""
    _models_workspace(tmp_path)
    assert _md(capsys, "models", workspace=tmp_path) == MODELS_TABLE
    table("models", workspace=tmp_path, format="csv")
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out.split("\n\n")[1].split("\n", 1)[1])))
    assert rows[0]["self-CIDEr R-DPP / SCST"] == repr(0.70 / 0.25) and rows[1]["diversity gain (≥ 1.5×)"] == "no"


@pytest.mark.integration
def test_models_table_before_any_fine_tune_is_scored_and_without_runs(tmp_path, capsys):
    """Only XE runs: the runs' table without the trade-off; no xe/xe-<tag> at all: one error line."""
    _model_run(tmp_path / "ws", "xe", "att2in", "att2in", (0.84, 2.0, 0.83, 0.55))
    _model_run(tmp_path / "ws", "scst", "att2in", "att2in", (1.6, 1.955, None, 0.145))  # scored without self-CIDEr
    out = _md(capsys, "models", workspace=tmp_path / "ws")
    assert "| att2in | SCST | 1.600 | 1.955 | – | 0.145 | – |" in out and "trade-off" not in out
    _toy_workspace(tmp_path / "toy")
    assert "no artifacts of `rdpp table models`" in error_line(rdpp("table", "models", "--workspace",
                                                                     str(tmp_path / "toy")))


# ---- selection ----------------------------------------------------------------------------------------

def _sel(ws: Path, name: str, mean: float, oracle: float, self_cider: float, div2: float = 0.5) -> None:
    _scores(ws, f"sel-{name}", average={"CIDEr": mean}, oracle={"CIDEr": oracle},
            diversity={"self_cider": self_cider, "div2": div2},
            human={"cider_leave_one_out": 0.8, "self_cider": 0.9, "images": 3})


@pytest.mark.unit
def test_height_above_a_curve_by_hand():
    pts = [(0.2, 1.5, "T=0.5"), (0.4, 1.0, "T=1"), (0.8, 0.6, "T=2")]
    assert height_above(pts, 0.3, 1.4) == pytest.approx(1.4 - 1.25)  # halfway between 1.5 and 1.0
    assert height_above(pts, 0.6, 0.7) == pytest.approx(0.7 - 0.8)
    assert height_above(pts, 0.9, 1.0) is None  # beyond the curve
    # a curve that folds back: the highest segment over x counts
    assert height_above([(0.2, 1.0, "a"), (0.6, 1.0, "b"), (0.4, 2.0, "c")], 0.5, 1.2) == pytest.approx(1.2 - 1.5)


@pytest.mark.integration
def test_selection_tables_frontier_and_plot_from_a_workspace(tmp_path, capsys):
    ws = tmp_path
    for label, base in (("xe", 0.8), ("scst", 1.5)):  # temperature curves: self-CIDEr up, CIDEr down with T
        for t, x, y in ((0.5, 0.2, base + 0.3), (1.0, 0.4, base), (2.0, 0.8, base - 0.6)):
            _sel(ws, f"{label}-random-k10" + ("" if t == 1.0 else f"-t{t}"), y, y + 0.5, x)
    _sel(ws, "dpp-m5-random-k10", 1.2, 2.0, 0.6)
    _sel(ws, "dpp-m2-random-k10", 1.6, 2.0, 0.3)
    _sel(ws, "xe-dpp-consensus-c50-k10", 1.0, 1.9, 0.7)
    out = _md(capsys, "selection", workspace=ws, ks="10", plot=ws / "p.png")
    assert "| XE | random sampling | 0.800 | 1.300 | 0.400 | 0.500 |" in out
    assert "| XE | --select dpp, consensus | 1.000 | 1.900 | 0.700 | 0.500 |" in out
    assert "| XE | 10 | --select dpp, consensus | +0.600 | +0.300 | yes |" in out
    # R-DPP m=5 at self-CIDEr 0.6: XE's curve there is 0.5 (between (0.4, 0.8) and (0.8, 0.2)),
    # SCST's 1.2 (between (0.4, 1.5) and (0.8, 0.9))
    assert "| point | self-CIDEr | mean CIDEr | vs XE curve | vs SCST curve |\n|---|---|---|---|---|\n" in out
    assert "| R-DPP m=5, random | 0.600 | 1.200 | +0.700 | +0.000 |" in out
    assert "| R-DPP m=2, random | 0.300 | 1.600 | +0.650 | -0.050 |" in out  # SCST's curve: 1.65 at 0.3
    assert "| XE --select dpp, consensus | 0.700 | 1.000 | +0.650 | -0.050 |" in out  # curves: 0.35, 1.05 at 0.7
    assert "- --select dpp, consensus: Δ self-CIDEr +0.100, Δ mean CIDEr -0.200" in out
    assert "XE, T = 0.5–2: T=0.5 (0.200, 1.100), T=1 (0.400, 0.800), T=2 (0.800, 0.200)" in out
    assert out.endswith(f"plot: {ws / 'p.png'}\n")
    assert (ws / "p.png").stat().st_size > 10_000


# ---- real photos --------------------------------------------------------------------------------------

def _real_workspace(ws: Path) -> Path:
    from PIL import Image

    (ws / "times.tsv").parent.mkdir(parents=True, exist_ok=True)
    (ws / "times.tsv").write_text("prepro\t13.6\t1.25\ntrain-xe\t1234.5\t3.5\n")
    _write(ws / "data" / "real" / "manifest.json", {
        "summary": {"images": 390, "train": 312, "val": 39, "test": 39, "captions": 1952, "vocab": 1234,
                    "word_count_threshold": 2, "unk_rate_train": 0.0312, "unk_rate": 0.0456, "clipped": 0.012},
        "config": {"max_length": 16}})
    _write(ws / "xe" / "xe" / "manifest.json", {"summary": {"val_cider": 0.4567, "baseline_cider": 0.0789}})
    ids = [7, 8, 9, 10]
    for k, name in enumerate(("xe", "scst", "dpp-m5")):
        _scores(ws, f"{name}-greedy", accuracy={"CIDEr": 0.5 + k / 10})
        _scores(ws, f"{name}-random10", accuracy={"CIDEr": 0.1}, average={"CIDEr": 0.4 + k / 10},
                oracle={"CIDEr": 1.0 + k / 10}, diversity={"self_cider": 0.2 + k / 10, "div2": 0.3 + k / 10})
        _write(ws / "samples" / f"{name}-random10" / "samples.json",
               [{"image_id": i, "captions": [f"{name} {i} {j % 2}" for j in range(10)]} for i in ids])
        _write(ws / "samples" / f"{name}-greedy" / "samples.json",
               [{"image_id": i, "captions": [f"{name} greedy {i}"]} for i in ids])
    for name in ("xe", "dpp-m5"):  # photos smaller than the sheet's thumbnails
        res = []
        for i in ids:
            Image.new("RGB", (64, 48), (i * 20, 90, 160)).save(ws / f"{i}.jpg")
            res.append({"image_id": i, "captions": [f"{name} says {j}" for j in range(5)],
                        "file": str(ws / f"{i}.jpg")})
        _write(ws / "captions" / f"{name}-random5" / "results.json", res)
    lic = ws / "LICENSES.tsv"
    names = ["Attribution-NonCommercial License", "Attribution License", "Attribution-NoDerivs License",
             "Attribution-ShareAlike License"]
    lic.write_text("image\tlicense\tflickr_url\n" + "".join(f"val2017/{i:012d}.jpg\t{n}\thttp://f/{i}\n"
                                                           for i, n in zip(ids, names)))
    return lic


@pytest.mark.integration
def test_real_photos_report_and_contact_sheet(tmp_path, capsys):
    """Times, the data and XE sentences, the model table, the photos whose licence lets them be
    shown (ids 8 and 10 here: CC BY and CC BY-SA) and the contact sheet PNG of the four photos."""
    lic = _real_workspace(tmp_path)
    out = _md(capsys, "real-photos", workspace=tmp_path, licenses=lic, sheet=tmp_path / "sheet.png")
    assert out.startswith("""\
Times per stage (wall clock; load average at the end of the stage):

| stage | seconds | load |
|---|---:|---:|
| prepro | 14 | 1.25 |
| train-xe | 1,234 | 3.5 |

Data artifact: 390 photos (train 312 / val 39 / test 39), 1,952 captions; vocabulary 1,234 words (count > 2, the \
`auto` threshold); UNK 3.1% of the training tokens, 4.6% of all; 1.2% of the captions clipped at 16 tokens.

XE: best val CIDEr-D 0.457 (greedy, UNK suppressed, training df) against 0.079 for the trivial captioner (the most \
frequent training caption for every photo).

| model | greedy CIDEr | mean sample CIDEr | oracle CIDEr (best of 10) | self-CIDEr | Div-2 |
|---|---:|---:|---:|---:|---:|
| XE | 0.500 | 0.400 | 1.000 | 0.200 | 0.300 |
| SCST | 0.600 | 0.500 | 1.100 | 0.300 | 0.400 |
| R-DPP m=5 | 0.700 | 0.600 | 1.200 | 0.400 | 0.500 |

Three test photos: each model's greedy caption, then its caption set (the first 5 of the 10 random captions, \
distinct ones):

- COCO 8 (CC BY 2.0, http://f/8)
  - XE: greedy “xe greedy 8”; random “xe 8 0” · “xe 8 1”
""")
    assert "- COCO 10 (CC BY-SA 2.0, http://f/10)\n" in out and "- COCO 7" not in out and "- COCO 9" not in out
    assert out.endswith(f"Contact sheet: {tmp_path / 'sheet.png'} (4 photos, 2 shown). Photos shown (COCO id, "
                        "original, licence):\n\n- 8 (http://f/8, CC BY 2.0)\n- 10 (http://f/10, CC BY-SA 2.0)\n")
    from PIL import Image

    with Image.open(tmp_path / "sheet.png") as im:
        assert im.width == 10 + 150 + 10 + 2 * 430 + 10 and im.height == 40 + 4 * (150 + 17 + 4 + 10) + 40


@pytest.mark.unit
def test_a_photo_smaller_than_the_thumbnail_is_read_before_its_file_closes(tmp_path):
    from PIL import Image

    from rdpp_cli.captioning.contact_sheet import _data_uri, thumbnail

    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "small.jpg")
    im = thumbnail(tmp_path / "small.jpg", 150)
    assert im.size == (40, 30) and im.getpixel((20, 15))[0] > 150
    assert _data_uri(tmp_path / "small.jpg").startswith("data:image/jpeg;base64,")


# ---- the command --------------------------------------------------------------------------------------

@pytest.mark.integration
def test_bad_requests_are_one_line(tmp_path):
    _toy_workspace(tmp_path / "ws")
    (tmp_path / "empty").mkdir()
    for args, message in (
            (["toy", "--workspace", str(tmp_path / "nowhere")], "does not exist"),
            (["toy", "--workspace", str(tmp_path / "empty")], "no artifacts of `rdpp table toy`"),
            (["precision", "--workspace", str(tmp_path / "ws")], "no runs of the precision sweep"),
            (["toy", "--workspace", str(tmp_path / "ws"), "--plot", "p.png"],
             "--plot belongs to `rdpp table selection`"),
            (["selection", "--ks", "5,x"], "--ks '5,x' is not a comma-separated list"),
            (["tables"], "TABLE 'tables' is not one of: toy, objective"),
            (["toy", "--format", "html"], "--format 'html' is not one of: md, csv, rich")):
        assert message in error_line(rdpp("table", *args)), args
    with pytest.raises(RdppError, match="name the tables to print"):
        table(workspace=tmp_path / "ws")


@pytest.mark.integration
def test_rdpp_table_prints_without_torch_pandas_or_matplotlib(tmp_path):
    """The evaluator's side of rdpp: `rdpp table` reads files only."""
    _toy_workspace(tmp_path)
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom rdpp_cli.cli.app import app\n"
            "r = CliRunner().invoke(app, ['table', 'toy', '--workspace', sys.argv[1]])\n"
            "assert r.exit_code == 0, r.output\nprint(r.output)\n"
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]" and TOY in r.stdout
