"""`rdpp demo` end to end: every artifact of the chain, the comparison table, reuse, and the trade-off the
seeded quick and full runs show."""

import json
import os
import subprocess
import sys
from pathlib import Path


import pytest

from rdpp_cli.artifacts import list_artifacts, read_artifact
from rdpp_cli.demo import DemoPlan

import cider_reference
from helpers import rdpp

pytestmark = pytest.mark.integration


MODELS = ("XE", "SCST", "R-DPP m=5")


def _demo(ws, quick=True):
    env = {**os.environ, "RDPP_NO_PROGRESS": "1", "COLUMNS": "200"}
    rdpp = os.path.join(os.path.dirname(sys.executable), "rdpp")
    return subprocess.run([rdpp, "demo", *(["--quick"] if quick else []), "--out", str(ws)], env=env,
                          capture_output=True, text=True, timeout=3600)


# the chain's wiring at a small size whose three models still give real beam captions (a CIDEr above 0): 48 train,
# 6 val and 6 test images, three XE epochs of 2 steps, one RL epoch of 4 steps (the seeded quick and full runs
# below check what the models learn)
TINY = DemoPlan(images=60, xe={"preset": "small", "epochs": 3, "batch_size": 24, "lr": 3e-3, "val_images": 6,
                                "seed": 123},
                rl={"epochs": 1, "batch_size": 12, "lr": 1e-3, "val_images": 0, "seed": 123}, n=4)


def test_the_chain_its_numbers_and_a_second_run_that_reuses_it(tmp_path, monkeypatch):
    """`rdpp demo --quick`'s wiring at a tiny size (seconds): every artifact, every number of the table
    recomputed by pycocoevalcap's scorer, the plot and the compare page, then a rerun that makes nothing."""
    monkeypatch.setattr(DemoPlan, "quick", classmethod(lambda cls: TINY))
    ws = tmp_path / "runs"
    r = rdpp("demo", "--quick", "--out", ws)
    assert r.exit_code == 0, r.output
    rows = _check_chain(ws, r.output, TINY.n)["rows"]
    assert all(row["beam_cider"] > 0 for row in rows.values()), rows  # the beam numbers are of real captions
    before = {a.path for a in list_artifacts(ws)}
    summary = json.loads((ws / "demo_summary.json").read_text())
    again = rdpp("demo", "--quick", "--out", ws)
    assert again.exit_code == 0, again.output
    assert {a.path for a in list_artifacts(ws)} == before  # nothing new: every step reused
    assert again.output.count("reusing") == 1 + 1 + 2 + 6 + 6 + 1  # data, xe, finetunes, samples, scores, compare
    assert json.loads((ws / "demo_summary.json").read_text())["rows"] == summary["rows"]


def _check_chain(ws: Path, stdout: str, n: int) -> dict:
    """The demo's artifacts and summary in ``ws``, every number recomputed; returns the summary."""
    arts = list_artifacts(ws)
    groups = sorted(a.path.parent.name for a in arts)
    assert groups.count("data") == 1 and groups.count("xe") == 1 and groups.count("finetune") == 2
    assert groups.count("samples") == 6 and groups.count("scores") == 6  # 3 models x (random n, beam 3)
    rewards = sorted(a.config["reward"] for a in arts if a.path.parent.name == "finetune")
    assert rewards == ["dpp", "scst"]

    summary = json.loads((ws / "demo_summary.json").read_text())
    assert tuple(summary["rows"]) == MODELS
    page = Path(summary["compare"])  # the compare page of the three models' random samples
    assert page == ws / "compare" / "toy-v1-test-v1" / "index.html" and '["XE","SCST","R-DPP m=5"]' in page.read_text()
    assert groups.count("compare") == 1  # an artifact, listed like the others
    # every number of the table, recomputed from each model's samples.json and the data artifact
    # by pycocoevalcap's own scorer (tests/cider_reference.py)
    data = next(a for a in arts if a.path.parent.name == "data").path
    for label, row in summary["rows"].items():
        sha = read_artifact(row["model"]).manifest_sha256
        made = [a for a in arts if a.path.parent.name == "samples" and sha in {i["manifest_sha256"] for i in a.inputs}]
        rand = next(a for a in made if a.config["method"] == "random")
        beam = next(a for a in made if a.config["method"] == "beam")
        want = cider_reference.scores_of_samples(rand.path, data)
        assert row["mean_cider"] == pytest.approx(want["mean_cider"], abs=1e-9), label
        assert row["oracle_cider"] == pytest.approx(want["oracle_cider"], abs=1e-9), label
        assert row["self_cider"] == pytest.approx(want["self_cider"], abs=1e-6), label
        assert row["div2"] == pytest.approx(want["div2"], abs=1e-12), label
        assert row["beam_cider"] == pytest.approx(cider_reference.scores_of_samples(beam.path, data)["mean_cider"],
                                                  abs=1e-9), label
    png = ws / "demo_plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in (*MODELS, "CIDEr (beam 3)", "mean CIDEr", f"oracle CIDEr (best of {n})", "self-CIDEr", "Div-2",
                 "demo_plot.png"):
        assert name in stdout, name
    return summary


@pytest.mark.slow  # ~2.5 min on 2 idle cores, in a fresh process as users run it
def test_demo_quick_shows_the_trade_off_on_its_seeded_models(tmp_path):
    """The smoke run's own settings: its XE model captions, SCST collapses its samples, and R-DPP keeps
    at least 1.5x SCST's diversity (self-CIDEr) with a better best-of-n (oracle) CIDEr."""
    ws = tmp_path / "runs"
    r = _demo(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = _check_chain(ws, r.stdout, 10)
    assert summary["rows"]["XE"]["beam_cider"] > 0.3  # its beam captions are not empty (CIDEr ~0.6, not 0)
    xe, scst, dpp = (summary["rows"][k] for k in MODELS)
    assert scst["self_cider"] < 0.8 * xe["self_cider"]
    assert dpp["self_cider"] >= 1.5 * scst["self_cider"]
    assert dpp["oracle_cider"] > scst["oracle_cider"]


@pytest.mark.slow  # ~6 min on 2 idle cores
def test_full_demo_shows_rdpp_more_diverse_than_scst_and_keeps_the_oracle(tmp_path):
    """The README's promise: the full demo's table shows the paper's trade-off (measured 2026-11-26:
    self-CIDEr SCST 0.459, R-DPP 0.768; oracle 1.973 vs 2.086; SCST the most accurate on average)."""
    r = _demo(tmp_path / "runs", quick=False)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads((tmp_path / "runs" / "demo_summary.json").read_text())["rows"]
    xe, scst, dpp = rows["XE"], rows["SCST"], rows["R-DPP m=5"]
    assert dpp["self_cider"] >= 1.5 * scst["self_cider"] and dpp["div2"] > scst["div2"]
    assert dpp["oracle_cider"] > scst["oracle_cider"]
    assert scst["mean_cider"] > dpp["mean_cider"] > xe["mean_cider"]
    assert scst["self_cider"] < xe["self_cider"]  # SCST collapses its samples
