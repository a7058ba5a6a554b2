"""Every registered model (rdpp_cli.models.registry.MODELS) through every stage on tiny data: the
mission's commands as typed with --model, exact resume after a crash, RL fine-tuning with every
reward, every decoding method and --select, bf16, and the refusals a model brings."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

from rdpp_cli.models import MODELS
from rdpp_cli.models.checkpoint import load_checkpoint
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.xe import train_xe

from helpers import Crash, error_line, rdpp, state_dict, tiny_workspace

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

OTHERS = sorted(set(MODELS) - {"att2in"})  # att2in has these tests of its own (test_train, test_finetune, ...)
XE = dict(preset="small", epochs=2, batch_size=6, val_images=3, device="cpu", seed=5, lr=2e-3)


@pytest.fixture(scope="module", params=OTHERS)
def trained(request, tmp_path_factory):
    """(model name, workspace with data/tiny-v1 and xe/<model>-small-v1 trained 2 epochs)."""
    ws = tiny_workspace(tmp_path_factory.mktemp(request.param))
    train_xe(ws / "data" / "tiny-v1", workspace=ws, model=request.param, **XE)
    return request.param, ws


def test_the_mission_commands_run_as_typed_with_the_model(trained):
    name, ws = trained
    art = ws / "xe" / f"{name}-small-v1"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["config"]["architecture"] == name and manifest["summary"]["architecture"] == name
    assert load_checkpoint(art / "checkpoints" / "best.pt")["model"] == name
    r = rdpp("finetune", "--workspace", ws, "--reward", "dpp", "--m", "3", "--epochs", "1", "--batch-size", "8",
             "--val-images", "2", "--device", "cpu")
    assert r.exit_code == 0, r.output
    ft = ws / "finetune" / "dpp-m3-v1"
    assert json.loads((ft / "manifest.json").read_text())["config"]["architecture"] == name
    r = rdpp("sample", "--workspace", ws, "--n", "3", "--method", "random", "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = rdpp("score", "--workspace", ws, "--oracle", "--self-cider")
    assert r.exit_code == 0, r.output
    scores = json.loads(next((ws / "scores").glob("*/scores.json")).read_text())
    assert scores["oracle"]["CIDEr"] >= scores["accuracy"]["CIDEr"] >= 0.0
    assert 0.0 <= scores["diversity"]["self_cider"] <= 1.0
    r = rdpp("ls", "--workspace", ws)
    assert f"architecture={name}" in r.output


def test_resume_after_a_crash_equals_an_uninterrupted_run(trained, tmp_path):
    name, ws = trained
    kw = {**XE, "save_every_steps": 2, "model": name}
    ref = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "ref", **kw)

    def crash_at_5(step):
        if step == 5:
            raise Crash("killed after step 5")

    with pytest.raises(Crash):
        train_xe(ws / "data" / "tiny-v1", out=tmp_path / "run", after_step=crash_at_5, **kw)
    resumed = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "run", **kw)
    a, b = state_dict(ref.path / "checkpoints" / "last.pt"), state_dict(resumed.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cols = ["epoch", "step", "loss", "val_cider", "lr"]
    pd.testing.assert_frame_equal(pd.read_csv(ref.path / "metrics.csv")[cols],
                                  pd.read_csv(resumed.path / "metrics.csv")[cols])


@pytest.mark.parametrize("reward", ["scst", "scst-mean", "xe-cider"])
def test_every_reward_fine_tunes_the_model(trained, tmp_path, reward):
    name, ws = trained
    art = finetune(ws / "xe" / f"{name}-small-v1", workspace=ws, out=tmp_path / reward, reward=reward, m=2,
                   epochs=1, batch_size=8, val_images=2, device="cpu")
    m = pd.read_csv(art.path / "metrics.csv")
    assert len(m) == 1 and m["loss"].notna().all() and "sample_cider" in m


@pytest.mark.parametrize("method", ["greedy", "beam", "dbs", "topk", "nucleus"])
def test_every_decoding_method_samples_the_model(trained, tmp_path, method):
    name, ws = trained
    extra = ["--beam", "2", "--groups", "2"] if method == "dbs" else ["--beam", "3"] if method == "beam" else []
    r = rdpp("sample", ws / "xe" / f"{name}-small-v1", "--workspace", ws, "--out", tmp_path / "s", "--n", "2",
             "--method", method, *extra, "--device", "cpu")
    assert r.exit_code == 0, r.output
    records = json.loads((tmp_path / "s" / "samples.json").read_text())
    assert len(records) == 2 and all(len(rec["captions"]) == 2 for rec in records)


def test_select_picks_from_the_models_candidates(trained, tmp_path):
    name, ws = trained
    r = rdpp("sample", ws / "xe" / f"{name}-small-v1", "--workspace", ws, "--out", tmp_path / "s", "--n", "2",
             "--candidates", "4", "--select", "dpp", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert all(len(rec["captions"]) == 2 for rec in json.loads((tmp_path / "s" / "samples.json").read_text()))


def test_bf16_trains_the_model(trained, tmp_path):
    name, ws = trained
    art = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "bf16", model=name, precision="bf16",
                   **{**XE, "epochs": 1})
    assert art.manifest["config"]["precision"] == "bf16"
    assert pd.read_csv(art.path / "metrics.csv")["loss"].notna().all()


def test_fast_on_is_refused_in_one_line_and_auto_falls_back(trained, tmp_path):
    name, ws = trained
    line = error_line(rdpp("train-xe", "--workspace", ws, "--model", name, "--preset", "small", "--fast", "on",
                           "--out", tmp_path / "f", "--device", "cpu"))
    assert "has no fast path yet" in line and "--fast auto" in line
    assert not (tmp_path / "f").exists()


def test_init_from_another_model_is_refused_in_one_line(trained, tmp_path):
    name, ws = trained
    line = error_line(rdpp("train-xe", "--workspace", ws, "--init-from", f"xe/{name}-small-v1", "--out",
                           tmp_path / "i", "--device", "cpu"))
    assert line.endswith(f"holds a {name} model, not att2in; pass --model {name}")
    assert not (tmp_path / "i").exists()


def test_an_unknown_model_is_refused_before_anything_is_written(tmp_path):
    ws = tiny_workspace(tmp_path / "ws")
    line = error_line(rdpp("train-xe", "--workspace", ws, "--model", "showtell"))
    assert "--model" in line and "att2in" in line
    assert not (ws / "xe").exists()
