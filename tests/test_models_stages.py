"""Every registered model (rdpp_cli.models.registry.MODELS) through every stage on tiny data: the
mission's commands as typed with --model, exact resume after a crash, RL fine-tuning with every
reward, every decoding method and --select, bf16, and the refusals a model brings."""

from __future__ import annotations

import json
import os
import subprocess
import shutil
import sys

import pandas as pd
import pytest
import torch

from rdpp_cli.models import MODELS
from rdpp_cli.models.checkpoint import load_checkpoint
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.xe import train_xe

from helpers import Crash, drawn_xe_dropout, error_line, rdpp, state_dict, tiny_workspace, write_tiny_data

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

# att2in has these tests of its own (test_train, test_finetune, ...); a model read from a folder (hf) too
# (test_model_hf.py builds a tiny pretrained one)
OTHERS = sorted(n for n, spec in MODELS.items() if n != "att2in" and not spec.folder_option)
XE = dict(preset="small", epochs=2, batch_size=6, val_images=3, device="cpu", seed=5, lr=2e-3)


@pytest.fixture(scope="module", params=OTHERS)
def trained(request, tmp_path_factory):
    """(model name, workspace with data/tiny-v1 and xe/<model>-small-v1 trained 2 epochs)."""
    ws = tiny_workspace(tmp_path_factory.mktemp(request.param))
    train_xe(ws / "data" / "tiny-v1", workspace=ws, model=request.param, **XE)
    return request.param, ws


def test_the_mission_commands_run_as_typed_with_the_model(trained, tmp_path):
    name, shared = trained
    ws = tmp_path / "ws"
    shutil.copytree(shared, ws)  # the shared workspace stays as it was
    # the commands word for word; the workspace's rdpp.yaml makes the fine-tune one short epoch and the score
    # compute Bleu_4 and CIDEr (the Java metrics have their test: test_score.py, real data)
    (ws / "rdpp.yaml").write_text("finetune:\n  epochs: 1\n  val_images: 2\nscore:\n  metrics: Bleu_4,CIDEr\n")
    art = ws / "xe" / f"{name}-small-v1"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["config"]["architecture"] == name and manifest["summary"]["architecture"] == name
    assert load_checkpoint(art / "checkpoints" / "best.pt")["model"] == name
    env = {"RDPP_WORKSPACE": str(ws)}  # the mission's four commands after train-xe, word for word
    for command in ("finetune --reward dpp --m 5", "sample --n 20 --method random", "score --oracle --self-cider"):
        r = rdpp(*command.split(), env=env)
        assert r.exit_code == 0, (command, r.output)
    ft = ws / "finetune" / "dpp-m5-v1"
    assert json.loads((ft / "manifest.json").read_text())["config"]["architecture"] == name
    samples = json.loads(next((ws / "samples").glob("dpp-m5-v1.*/samples.json")).read_text())
    assert len(samples) == 2 and all(len(rec["captions"]) == 20 for rec in samples)
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


@pytest.mark.slow
def test_fast_on_trains_the_model_with_the_eager_numbers(trained, tmp_path, monkeypatch):
    """``--fast on`` (compiled with aot_eager: inductor takes minutes on 2 cores) for XE and R-DPP:
    metrics.csv as the eager run's within float32 rounding, the manifest says it was on."""
    from rdpp_cli.training import fast as F

    monkeypatch.setitem(F.SETTINGS, "cpu", F.FastSettings(backend="aot_eager", log_every=2))
    drawn_xe_dropout(monkeypatch)  # the eager XE step with the fast step's masks, drawn once
    name, ws = trained
    data = ws / "data" / "tiny-v1"
    xe = {f: train_xe(data, out=tmp_path / f"xe-{f}", model=name, fast=f, **{**XE, "epochs": 1}) for f in ("off", "on")}
    ft = {f: finetune(xe["off"].path, data=data, out=tmp_path / f"ft-{f}", reward="dpp", m=3, epochs=1, batch_size=6,
                      val_images=3, device="cpu", seed=2, fast=f) for f in ("off", "on")}
    for runs in (xe, ft):
        a, b = (pd.read_csv(runs[f].path / "metrics.csv").drop(columns=["time", "images_per_s"]) for f in ("off", "on"))
        assert list(a.columns) == list(b.columns) and len(a) == 1
        pd.testing.assert_frame_equal(b, a, rtol=1e-4, atol=1e-6)
        assert runs["on"].manifest["config"]["fast"] == "on"


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


DDP_RUN = """
import sys
from dataclasses import replace
from pathlib import Path

import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models.registry import model_spec
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.xe import xe_loss


def xe_loss_float64(model, batch):
    return xe_loss(model, replace(batch, att=batch.att.double(), fc=batch.fc.double()))


name, data, out = sys.argv[1:4]
d = DataArtifact.open(data)
torch.manual_seed(0)
model = model_spec(name).build("small", vocab_size=d.vocab_size, att_feat_size=d.att_dim, fc_feat_size=d.fc_dim,
                               seq_length=d.seq_length, drop_prob_lm=0.0, dropout=0.0).double()
cfg = TrainLoopOptions(epochs=1, batch_size=6, lr=1e-3, lr_decay_every=0, val_images=0, device="cpu", seed=0)
TrainingRecipe(stage="xe", model=model, data=d, out_dir=Path(out), opts=cfg, step_fn=xe_loss_float64,
               inputs=[d.artifact], manifest_config={}).run()
"""


@pytest.mark.slow  # ~25 s each on 2 cores; tests/test_train_ddp.py runs two processes in the default run
@pytest.mark.parametrize("name", OTHERS)
def test_two_processes_train_the_same_weights_as_one(tmp_path, name):
    """torchrun with two gloo processes: each takes half of every global batch of 6 images, and the
    weights after an epoch are those of one process (float64, no dropout)."""
    data = write_tiny_data(tmp_path / "data", n_train=12, n_val=2, n_test=0)
    script = tmp_path / "run.py"
    script.write_text(DDP_RUN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RDPP_NO_PROGRESS": "1"}
    runs = {"2p": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
            "1p": [sys.executable]}
    for tag, launcher in runs.items():
        r = subprocess.run([*launcher, str(script), name, str(data), str(tmp_path / tag)], capture_output=True,
                           text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    a, b = (state_dict(tmp_path / tag / "checkpoints" / "last.pt") for tag in runs)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
