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
from rdpp_cli.training.loop import greedy_cider

sys.path.insert(0, str(Path(__file__).parent))
from test_loader import write_tiny_data  # noqa: E402


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
