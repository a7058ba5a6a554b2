"""examples/selection_tables.py: tables, the frontier comparison and the plot from hand-made scores."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "selection_tables.py"


def _module():
    spec = importlib.util.spec_from_file_location("selection_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _scores(ws: Path, name: str, mean: float, oracle: float, self_cider: float, div2: float = 0.5) -> None:
    d = ws / "scores" / f"sel-{name}"
    d.mkdir(parents=True)
    (d / "scores.json").write_text(json.dumps({
        "average": {"CIDEr": mean}, "oracle": {"CIDEr": oracle},
        "diversity": {"self_cider": self_cider, "div2": div2},
        "human": {"cider_leave_one_out": 0.8, "self_cider": 0.9, "images": 3}}))


def test_height_above_a_curve_by_hand():
    m = _module()
    pts = [(0.2, 1.5, "T=0.5"), (0.4, 1.0, "T=1"), (0.8, 0.6, "T=2")]
    assert m.height_above(pts, 0.3, 1.4) == pytest.approx(1.4 - 1.25)  # halfway between 1.5 and 1.0
    assert m.height_above(pts, 0.6, 0.7) == pytest.approx(0.7 - 0.8)
    assert m.height_above(pts, 0.9, 1.0) is None  # beyond the curve
    # a curve that folds back: the highest segment over x counts
    assert m.height_above([(0.2, 1.0, "a"), (0.6, 1.0, "b"), (0.4, 2.0, "c")], 0.5, 1.2) == pytest.approx(1.2 - 1.5)


def test_tables_frontier_and_plot_from_a_workspace(tmp_path):
    ws = tmp_path
    for label, base in (("xe", 0.8), ("scst", 1.5)):  # temperature curves: self-CIDEr up, CIDEr down with T
        for t, x, y in ((0.5, 0.2, base + 0.3), (1.0, 0.4, base), (2.0, 0.8, base - 0.6)):
            _scores(ws, f"{label}-random-k10" + ("" if t == 1.0 else f"-t{t}"), y, y + 0.5, x)
    _scores(ws, "dpp-m5-random-k10", 1.2, 2.0, 0.6)
    _scores(ws, "dpp-m2-random-k10", 1.6, 2.0, 0.3)
    _scores(ws, "xe-dpp-consensus-c50-k10", 1.0, 1.9, 0.7)
    r = subprocess.run([sys.executable, str(SCRIPT), str(ws), "--ks", "10", "--out", str(ws / "p.png")],
                       capture_output=True, text=True, check=True)
    out = r.stdout
    assert "| XE | random sampling | 0.800 | 1.300 | 0.400 | 0.500 |" in out
    assert "| XE | --select dpp, consensus | 1.000 | 1.900 | 0.700 | 0.500 |" in out
    assert "| XE | 10 | --select dpp, consensus | +0.600 | +0.300 | yes |" in out
    # R-DPP m=5 at self-CIDEr 0.6: XE's curve there is 0.5 (between (0.4, 0.8) and (0.8, 0.2)),
    # SCST's 1.2 (between (0.4, 1.5) and (0.8, 0.9))
    assert "| R-DPP m=5, random | 0.600 | 1.200 | +0.700 | +0.000 |" in out
    assert "| R-DPP m=2, random | 0.300 | 1.600 | +0.650 | -0.050 |" in out  # SCST's curve: 1.65 at 0.3
    assert "- --select dpp, consensus: Δ self-CIDEr +0.100, Δ mean CIDEr -0.200" in out
    assert (ws / "p.png").stat().st_size > 10_000
