"""benchmarks/data.py recipe: the paper recipe's GPU-hours from measured epochs (the README figure),
with the presets' own settings. Arithmetic only: hand-computed cases, no timing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "data_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "data.py")
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)
pytestmark = pytest.mark.unit


def _row(stage, batch, prec, cache, workers, ips, ss="", val_s=0.0):
    return {"stage": stage, "batch": batch, "precision": prec, "cache": cache, "workers": workers,
            "images_per_s": ips, "ss": ss, "val_s": val_s}


def test_the_recipe_counts_plain_and_scheduled_sampling_epochs_and_rl_epochs():
    # 5 × 80 s + 25 × 120 s + 100 × 153 s = 18,700 s
    assert R.recipe_hours(80, 120, 153, xe_epochs=30, ss_epochs=25, rl_epochs=100) == pytest.approx(18_700 / 3600)
    assert R.epoch_seconds(1_000.0) == pytest.approx(113.287)


def test_the_presets_batches_and_schedule_are_read_from_the_recipes():
    from common import recipe

    xe, rl = recipe("att2in", "xe"), recipe("att2in", "finetune")
    assert (xe["epochs"], xe["batch_size"], xe["ss_epochs"]) == (30, 128, 25)  # ss from epoch 0, > 0 from epoch 5
    assert (rl["epochs"], rl["batch_size"]) == (100, 128)


def test_a_setting_counts_its_slower_cache_state_its_faster_worker_count_and_its_validation():
    rates = R.settings([
        _row("xe", 128, "fp32", "warm", 2, 1_400.0), _row("xe", 128, "fp32", "cold", 2, 1_200.0),
        _row("xe", 128, "fp32", "warm", 4, 1_500.0, val_s=2.0), _row("xe", 128, "fp32", "cold", 4, 1_300.0, val_s=3.0),
        _row("xe", 128, "fp32", "warm", 4, 500.0, ss="ss", val_s=3.0),
        _row("dpp", 128, "fp32", "warm", 4, 800.0, val_s=3.0), _row("dpp", 128, "fp32", "cold", 4, 740.0, val_s=4.0),
    ])
    assert {k: v["images_per_s"] for k, v in rates.items()} == {
        ("xe", 128, "fp32", ""): 1_300.0, ("xe", 128, "fp32", "ss"): 500.0, ("dpp", 128, "fp32", ""): 740.0}
    xe = {"epochs": 30, "batch_size": 128, "ss_epochs": 25}
    rows = R.recipes(rates, xe, {"epochs": 100, "batch_size": 128}, val=500)
    assert len(rows) == 1 and "XE batch 128 fp32, 5 epochs plain + 25 with scheduled sampling" in rows[0]["recipe"]
    val = lambda s: s * 5_000 / 500  # noqa: E731 -- validation on 500 images, scaled to COCO's 5,000
    want = (5 * (113_287 / 1_300 + val(3.0)) + 25 * (113_287 / 500 + val(3.0)) + 100 * (113_287 / 740 + val(4.0)))
    assert rows[0]["gpu_hours"] == pytest.approx(want / 3600)
