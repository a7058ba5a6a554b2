"""benchmarks/recipe_hours.py: the paper recipe's GPU-hours from measured epochs (the README figure).
Arithmetic only: hand-computed cases, no timing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "recipe_hours", Path(__file__).resolve().parents[1] / "benchmarks" / "recipe_hours.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)
pytestmark = pytest.mark.unit


def _row(stage, batch, prec, cache, workers, ips):
    return {"stage": stage, "batch": batch, "precision": prec, "cache": cache, "workers": workers, "images_per_s": ips}


def test_recipe_is_30_xe_and_100_rl_epochs_of_cocos_training_images():
    # a COCO epoch of 80 s (XE) and 153 s (R-DPP): 30 × 80 + 100 × 153 = 17,700 s = 4.917 h
    assert R.recipe_hours(113_287 / 80, 113_287 / 153) == pytest.approx(17_700 / 3600)
    assert R.epoch_seconds(1_000.0) == pytest.approx(113.287)
    assert R.recipe_hours(1.0, 2.0, xe_epochs=1, rl_epochs=1, images=3600) == pytest.approx(1.5)


def test_a_setting_counts_its_slower_cache_state_and_its_faster_worker_count():
    rates = R.settings([
        _row("xe", 50, "fp32", "warm", 2, 1_400.0), _row("xe", 50, "fp32", "cold", 2, 1_200.0),
        _row("xe", 50, "fp32", "warm", 4, 1_500.0), _row("xe", 50, "fp32", "cold", 4, 1_300.0),
        _row("xe", 200, "bf16", "warm", 4, 3_000.0),
        _row("dpp", 128, "fp32", "warm", 4, 800.0), _row("dpp", 128, "fp32", "cold", 4, 740.0),
    ])
    assert rates == {("xe", 50, "fp32"): 1_300.0, ("xe", 200, "bf16"): 3_000.0, ("dpp", 128, "fp32"): 740.0}
    rows = R.recipes(rates)
    assert [r["recipe"] for r in rows] == [
        "XE batch 50 fp32 (the paper's), then R-DPP m=5 (batch 128 fp32)",
        "XE batch 200 bf16 (the fastest measured), then R-DPP m=5 (batch 128 fp32)"]
    assert rows[0]["gpu_hours"] == pytest.approx((30 * 113_287 / 1_300 + 100 * 113_287 / 740) / 3600)
    assert rows[1]["xe_epoch_s"] == pytest.approx(113_287 / 3_000)
