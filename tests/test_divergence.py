"""NaN, Inf and absurd options (docs/training.md): a diverging run stops with one line and never writes
a non-finite checkpoint; absurd options are refused before anything is written; JSON never holds NaN."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import numpy as np
import torch

from rdpp_cli.artifacts import atomic_write_json, read_artifact
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.errors import RdppError
from rdpp_cli.models.att2in import Att2in
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.xe import xe_loss

from helpers import att2in_for, error_line, listing, model_artifact, rdpp, state_dict, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> DataArtifact:
    return DataArtifact.open(write_tiny_data(tmp_path_factory.mktemp("d") / "tiny", n_train=16, n_val=4, n_test=2))


def _model(data: DataArtifact) -> Att2in:
    torch.manual_seed(0)
    return att2in_for(data, 16, dropout=0.5)


def _train(data: DataArtifact, out: Path, step_fn, epochs: int = 3, model=None, after_step=None):
    cfg = TrainLoopOptions(epochs=epochs, batch_size=8, lr=1e-2, val_images=2, device="cpu", seed=0)  # 2 steps/epoch
    return TrainingRecipe(stage="xe", model=model or _model(data), data=data, out_dir=out, opts=cfg, step_fn=step_fn,
                          inputs=[data.artifact], manifest_config={}, after_step=after_step).run()


def _finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in state_dict(path).values())


@pytest.mark.integration
def test_a_nan_loss_stops_the_run_and_no_checkpoint_holds_it(data, tmp_path):
    def nan_at_step_3(net, batch):
        loss = xe_loss(net, batch)
        return loss * float("nan") if (batch.epoch, batch.batch) == (1, 0) else loss

    with pytest.raises(RdppError) as e:
        _train(data, tmp_path / "m", nan_at_step_3)
    msg = str(e.value)
    assert msg.startswith("training diverged at epoch 2, step 3: the loss is nan (last finite loss ")
    assert "lower --lr (now 0.01)" in msg and "--grad-clip" in msg and "\n" not in msg
    ckpt = tmp_path / "m" / "checkpoints"
    assert _finite(ckpt / "last.pt") and _finite(ckpt / "best.pt")  # both still epoch 1's
    assert torch.load(ckpt / "last.pt", weights_only=True)["epoch"] == 1
    assert not (tmp_path / "m" / "manifest.json").exists() and not (tmp_path / "m" / ".rdpp-lock").exists()


@pytest.mark.integration
def test_divergence_in_epoch_one_writes_no_best_pt(data, tmp_path):
    def nan_at_step_2(net, batch):
        loss = xe_loss(net, batch)
        return loss + float("inf") if batch.batch == 1 else loss

    with pytest.raises(RdppError, match="at epoch 1, step 2: the loss is inf"):
        _train(data, tmp_path / "m", nan_at_step_2)
    assert not (tmp_path / "m" / "checkpoints" / "best.pt").exists()
    assert not (tmp_path / "m" / "checkpoints" / "last.pt").exists()


@pytest.mark.integration
def test_non_finite_weights_are_never_validated_or_saved(data, tmp_path):
    """A finite loss with weights gone to infinity (e.g. an overflowing update): caught before the
    epoch's validation and checkpoints."""
    model = _model(data)

    def poison_after_step_2(step: int) -> None:
        if step == 2:
            with torch.no_grad():
                model.logit.weight[0, 0] = float("inf")

    with pytest.raises(RdppError, match=r"at epoch 1, step 2: parameter logit\.weight holds NaN or infinity"):
        _train(data, tmp_path / "m", xe_loss, model=model, after_step=poison_after_step_2)
    assert not (tmp_path / "m" / "checkpoints" / "best.pt").exists()
    assert not (tmp_path / "m" / "checkpoints" / "last.pt").exists()


@pytest.mark.integration
def test_the_cli_prints_divergence_as_one_line(tmp_path, monkeypatch):
    ws = tmp_path / "runs"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2)
    import rdpp_cli.training.xe as xe

    monkeypatch.setattr(xe, "xe_loss", lambda net, batch, *steps: torch.tensor(float("nan"), requires_grad=True))
    line = error_line(rdpp("train-xe", "--preset", "small", "--epochs", "1", "--batch-size", "8", "--val-images",
                           "0", "--device", "cpu", "--workspace", ws))
    assert line.startswith("error: training diverged at epoch 1, step 1: the loss is nan (no finite loss yet)")
    assert not list(ws.rglob(".rdpp-lock"))  # the unfinished folder is left unlocked: a rerun may resume it
    assert list(ws.rglob(".rdpp-partial.json"))


# -- absurd options: refused before anything is written ----------------------------------------------

@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    model_artifact(ws, read_artifact(write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3)))
    return ws


TRAIN = ["--preset", "small", "--epochs", "1", "--batch-size", "8", "--val-images", "0", "--device", "cpu"]


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["train-xe", *TRAIN, "--lr", "1e30"], "--lr must be in (0, 1] (got 1e+30)"),
    (["train-xe", *TRAIN, "--seed", "-1"], "--seed must be an integer from 0 to 2**63-1 (got -1)"),
    (["train-xe", *TRAIN, "--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
    (["finetune", "--epochs", "1", "--seed", "-3", "--device", "cpu"], "--seed must be an integer"),
    (["finetune", "--epochs", "1", "--lr", "nan", "--device", "cpu"], "--lr must be in (0, 1] (got nan)"),
    (["sample", "--n", "2", "--max-images", "0"], "--max-images must be at least 1 (got 0)"),
    (["sample", "--n", "2", "--max-images", "-15"], "--max-images must be at least 1 (got -15)"),
    (["sample", "--n", "2", "--max-len", "0"], "--max-len must be at least 1 (got 0)"),
    (["sample", "--n", "2", "--seed", "-1"], "--seed must be an integer"),
    (["sample", "--n", "2", "--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
    (["sample", "--n", "2", "--method", "dbs", "--groups", "2", "--diversity-lambda", "nan"],
     "--diversity-lambda is nan: options must be finite numbers"),
    (["prepro", "toy", "--images", "20", "--seed", "-1"], "--seed must be an integer"),
])
def test_absurd_options_are_refused_before_anything_is_written(ws, args, message):
    before = listing(ws)
    line = error_line(rdpp(*args, "--workspace", ws))
    assert message in line, line
    assert listing(ws) == before


@pytest.mark.unit
def test_json_never_holds_nan(tmp_path):
    with pytest.raises(RdppError, match=r"x\.json: scores\.1\.CIDEr is not a finite number and JSON cannot hold it"):
        atomic_write_json(tmp_path / "x.json", {"scores": [{"CIDEr": 1.0}, {"CIDEr": float("nan")}]})
    assert list(tmp_path.iterdir()) == []


def _any_true_on(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank))
    from rdpp_cli.training import distributed as D

    D.setup("cpu")
    try:
        results.put((rank, D.any_true(rank == 1), D.any_true(False)))
    finally:
        D.teardown()


@pytest.mark.integration
def test_under_ddp_every_process_learns_that_one_diverged():
    """The loop's per-step check under torchrun: a NaN on one process stops all of them at the same step
    (otherwise the others would wait forever in the next all-reduce)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.start_processes(_any_true_on, args=(2, port, results), nprocs=2, start_method="spawn")
    got = sorted(results.get() for _ in range(2))
    assert got == [(0, True, False), (1, True, False)]


# -- NaN from a corrupt input or checkpoint: the message names the file and `rdpp verify`, not --lr -----------

def _nan_features(path: Path, rows: list[int]) -> Path:
    """A data artifact whose features.h5 holds NaN in ``rows``, with a manifest that matches its files
    (as a data artifact made from broken features would have)."""
    import h5py

    from rdpp_cli.artifacts import write_manifest

    with h5py.File(path / "features.h5", "r+") as f:
        for r in rows:
            f["att"][r, 0, 0] = np.nan
    art = read_artifact(path)
    write_manifest(path, "rdpp.data", art.config, summary=art.manifest.get("summary"))
    return path


@pytest.mark.integration
def test_nan_features_in_training_name_the_file_not_the_learning_rate(tmp_path):
    ws = tmp_path / "runs"
    data = _nan_features(write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2), [5])
    line = error_line(rdpp("train-xe", *TRAIN, "--workspace", ws))
    assert f"{data / 'features.h5'} holds NaN or infinity in the features of image 1005 (row 5)" in line, line
    assert f"run `rdpp verify {data}`" in line and "--lr" not in line and "bug in rdpp" not in line


@pytest.mark.integration
def test_nan_features_in_sampling_name_the_file(tmp_path):
    ws = tmp_path / "runs"
    data = _nan_features(write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3), [11])  # test split
    model_artifact(ws, read_artifact(data))
    line = error_line(rdpp("sample", "--n", "2", "--device", "cpu", "--workspace", ws))
    assert f"{data / 'features.h5'} holds NaN or infinity in the features of image 1011 (row 11)" in line, line
    assert "rdpp verify" in line and "bug in rdpp" not in line
    assert not list((ws / "samples").rglob("manifest.json"))


def _nan_model(ws: Path, data) -> Path:
    """A model artifact whose checkpoint holds NaN weights (its manifest matches the file)."""
    from rdpp_cli.artifacts import finish, prepare_output, write_manifest
    from rdpp_cli.models.checkpoint import save_checkpoint

    ds = DataArtifact(data)
    net = _model(ds)
    with torch.no_grad():
        net.logit.weight[3, 1] = float("nan")
    out = prepare_output(None, workspace=ws, group="xe", name="nan", kind="rdpp.model", config={"stage": "xe"})
    save_checkpoint(out / "checkpoints" / "best.pt", net, ds.words)
    write_manifest(out, "rdpp.model", {"stage": "xe"}, inputs=[data])
    finish(out)
    return out / "checkpoints" / "best.pt"


@pytest.mark.integration
@pytest.mark.parametrize("command", [["sample", "--n", "2"], ["finetune", "--epochs", "1", "--batch-size", "8",
                                                              "--val-images", "0"]])
def test_a_checkpoint_holding_nan_is_named_with_rdpp_verify(tmp_path, command):
    ws = tmp_path / "runs"
    data = read_artifact(write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3))
    ckpt = _nan_model(ws, data)
    before = listing(ws)
    line = error_line(rdpp(*command, "--from", "nan-v1", "--device", "cpu", "--workspace", ws))
    assert f"checkpoint {ckpt} holds NaN or infinity in logit.weight" in line, line
    assert "rdpp verify" in line and "--lr" not in line and "bug in rdpp" not in line
    assert listing(ws) == before


@pytest.mark.unit
def test_a_resume_state_holding_nan_is_refused(tmp_path):
    from rdpp_cli.training.state import load_state, save_state

    save_state(tmp_path / "last_state.pt", {"model": {"w": torch.tensor([1.0, float("inf")])}})
    with pytest.raises(RdppError, match=r"last_state\.pt holds NaN or infinity in w: the file is damaged .*--no-resume"):
        load_state(tmp_path / "last_state.pt")
