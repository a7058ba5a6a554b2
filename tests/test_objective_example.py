"""examples/own_loop.py (docs/api.md) runs end to end: a user's own model and loop, fine-tuned with
rdpp_cli.objective on the CPU. The numbers of its fixed-seed runs move as each reward says they
should: SCST raises the samples' CIDEr-D, R-DPP raises their diversity (self-CIDEr) beyond SCST's."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_loop.py"


def test_the_example_fine_tunes_a_tiny_model_with_r_dpp_and_scst(monkeypatch, capsys):
    # as typed, `python examples/own_loop.py --rl-steps 20` (in this process: torch is loaded once)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--rl-steps", "20"])
    example = runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("cross-entropy:") and any(line.startswith("step  19") for line in lines)
    dpp = json.loads(lines[-1])
    scst = example["main"](["--reward", "scst", "--m", "3", "--rl-steps", "20"])
    for run in (dpp, scst):
        assert run["losses_finite"] and run["max_weights_diff"] == 0.0  # ids + decode == the same texts
        assert run["xe_loss"][1] < 0.5 * run["xe_loss"][0]
        assert math.isfinite(run["sample_cider_first"]) and run["sample_cider_first"] > 1.0  # XE learnt the captions
    assert (dpp["reward"], dpp["m"]) == ("dpp", 5)
    assert scst["sample_cider_last"] > scst["sample_cider_first"] + 0.1  # SCST: more accurate samples
    assert dpp["self_cider_last"] > dpp["self_cider_first"] + 0.03  # R-DPP: more diverse samples
    assert dpp["self_cider_last"] > scst["self_cider_last"] + 0.1
    assert all(text.endswith(".") for text in scst["greedy"].values())  # the model's decode made the texts
