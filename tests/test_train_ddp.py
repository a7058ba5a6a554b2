"""`torchrun --nproc-per-node 2 -m rdpp_cli train-xe` with gloo on CPU: one artifact, rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from rdpp_cli.artifacts import list_artifacts
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models.checkpoint import load_model
from rdpp_cli.training.validation import greedy_cider

from helpers import write_tiny_data

pytestmark = pytest.mark.integration



def test_two_process_gloo_run_writes_one_artifact(tmp_path):
    ws = tmp_path / "ws"
    data = write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=5, n_test=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RDPP_NO_PROGRESS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "rdpp_cli", "train-xe", "--workspace", str(ws), "--preset", "small", "--epochs", "2",
           "--batch-size", "6", "--val-images", "5", "--val-batch-size", "2", "--save-every-steps", "2",
           "--lr", "2e-3", "--device", "cpu", "--seed", "7"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("rdpp xe: done") == 1  # only rank 0 prints the summary

    arts = list_artifacts(ws, ("xe",))
    assert [a.name for a in arts] == ["att2in-small-v1"]
    assert sorted(p.name for p in (ws / "xe").iterdir()) == ["att2in-small-v1"]
    art = arts[0]
    assert art.manifest["config"]["processes"] == 2
    assert art.inputs[0]["path"] == "data/tiny-v1"  # relative to the workspace
    assert not (art.path / ".rdpp-lock").exists()  # rank 0 held the folder and let it go
    m = pd.read_csv(art.path / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m["step"]) == [3, 6]  # 16 images / 6 per step: 3 steps
    state = torch.load(art.path / "checkpoints" / "last_state.pt", weights_only=True)
    assert len(state["rng"]) == 2 and not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])

    # validation was shared out (3 + 2 images) and summed: best.pt rescored alone gives the same mean
    d = DataArtifact.open(data)
    model, _, ck = load_model(art.path / "checkpoints" / "best.pt")
    sums = greedy_cider(model, d, d.split_indices("val"))
    assert sums["_n"] == 5
    assert sums["val_cider"] / 5 == pytest.approx(art.manifest["summary"]["val_cider"], abs=1e-9)
    assert ck["val_cider"] == pytest.approx(m["val_cider"].max())


# -- the same global batch on 1 and 2 processes gives the same weights --------------------------------

RUN = """
import sys
from dataclasses import replace
from pathlib import Path

import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.xe import xe_loss


def xe_loss_float64(model, batch):
    return xe_loss(model, replace(batch, att=batch.att.double()))


def run(data, out):
    d = DataArtifact.open(data)
    torch.manual_seed(0)  # the same initial weights (DDP also broadcasts rank 0's)
    model = Att2in(Att2inConfig(vocab_size=d.vocab_size, input_encoding_size=16, rnn_size=16, att_hid_size=16,
                                att_feat_size=d.att_dim, drop_prob_lm=0.0,
                                seq_length=d.seq_length)).double()
    cfg = TrainLoopOptions(epochs=2, batch_size=6, lr=1e-2, lr_decay_every=0, val_images=0, device="cpu", seed=0)
    TrainingRecipe(stage="xe", model=model, data=d, out_dir=Path(out), opts=cfg, step_fn=xe_loss_float64,
                   inputs=[d.artifact], manifest_config={}).run()


if __name__ == "__main__":
    for data, out in zip(sys.argv[1::2], sys.argv[2::2]):
        run(data, out)
"""


def _max_weight_diff(a: Path, b: Path) -> float:
    wa = torch.load(a / "checkpoints" / "last.pt", weights_only=True)["state_dict"]
    wb = torch.load(b / "checkpoints" / "last.pt", weights_only=True)["state_dict"]
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory):
    """Two data sets trained by one process and by two gloo processes (no dropout, so the only
    difference is how the global batch of 6 images is shared out; float64, because Adam's first
    steps divide each gradient entry by its own size, which turns float32 round-off of entries
    near 0 into differences of the order of the learning rate): ``equal`` has the same number of
    caption tokens per image, ``unequal`` gives some images a sixth caption, so each step's 5
    captions of those images are a draw and the processes' token counts differ."""
    root = tmp_path_factory.mktemp("ddp")
    sets = {
        "equal": write_tiny_data(root / "equal", n_train=16, n_val=2, n_test=0),
        "unequal": write_tiny_data(root / "unequal", n_train=16, n_val=2, n_test=0,
                                   extra_captions={i: 1 for i in range(0, 16, 3)}),
    }
    script = root / "run.py"
    script.write_text(RUN)
    args = [str(a) for name, d in sets.items() for a in (d, root / f"{name}-2p")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RDPP_NO_PROGRESS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script), *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([sys.executable, str(script), *[a.replace("-2p", "-1p") for a in args]],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return root


def test_two_processes_train_the_same_weights_as_one(one_and_two_processes):
    root = one_and_two_processes
    assert _max_weight_diff(root / "equal-1p", root / "equal-2p") < 1e-6


def test_two_processes_train_the_same_weights_as_one_with_unequal_captions(one_and_two_processes):
    root = one_and_two_processes
    assert _max_weight_diff(root / "unequal-1p", root / "unequal-2p") < 1e-6
