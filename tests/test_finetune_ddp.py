"""`torchrun --nproc-per-node 2 -m rdpp_cli finetune` with gloo on CPU: one artifact, rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from rdpp_cli.artifacts import list_artifacts
from rdpp_cli.training.xe import train_xe

from helpers import write_tiny_data

pytestmark = pytest.mark.integration



@pytest.mark.slow  # ~50 s: two processes start torch and train
def test_two_process_gloo_finetune_writes_one_artifact(tmp_path):
    ws = tmp_path / "ws"
    data = write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=4, n_test=2)
    xe = train_xe(data, workspace=ws, preset="small", epochs=1, batch_size=8, val_images=0, lr=2e-3,
                  device="cpu", seed=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RDPP_NO_PROGRESS": "1"}
    # "--samples", not "--m": torchrun's parser reads "--m" as an abbreviation of its own options
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "rdpp_cli", "finetune", "--workspace", str(ws), "--reward", "dpp", "--samples", "3", "--epochs", "2",
           "--batch-size", "8", "--val-images", "4", "--val-batch-size", "2", "--lr", "1e-3", "--device", "cpu"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("rdpp finetune: done") == 1  # only rank 0 prints the summary

    arts = list_artifacts(ws, ("finetune",))
    assert [a.name for a in arts] == ["dpp-m3-v1"]
    art = arts[0]
    assert art.manifest["config"]["processes"] == 2 and art.manifest["config"]["reward"] == "dpp"
    assert [i["path"] for i in art.inputs] == ["data/tiny-v1", "xe/att2in-small-v1"]
    m = pd.read_csv(art.path / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m["step"]) == [2, 4]  # 16 images / 8 per step
    for col in ("reward", "sample_cider", "self_cider", "val_cider", "val_sample_cider", "val_self_cider"):
        assert np.isfinite(m[col]).all(), col
    state = torch.load(art.path / "checkpoints" / "last_state.pt", weights_only=True)
    assert len(state["rng"]) == 2
