"""A moved workspace (docs/workspace.md): inputs are recorded relative to the workspace with their
manifest hash, found by hash where a path moved, and a run's resume identity is its content (input
hashes and options), so that after `mv runs elsewhere` sample, score, ls and resume all work."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.training.xe import train_xe

from helpers import Crash, rdpp, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def _crash_at(k: int):
    def hook(step: int) -> None:
        if step == k:
            raise Crash()
    return hook


XE = {"preset": "small", "batch_size": 8, "val_images": 2, "device": "cpu", "seed": 1}


def test_a_moved_workspace_samples_scores_lists_and_resumes(tmp_path, capsys):
    ws = tmp_path / "runs"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=3)
    xe = train_xe("tiny-v1", workspace=ws, epochs=1, **XE)
    assert rdpp("sample", "--n", "2", "--workspace", ws, "--device", "cpu").exit_code == 0
    with pytest.raises(Crash):  # a run killed after its first epoch's checkpoint
        train_xe("tiny-v1", workspace=ws, epochs=2, save_every_steps=1, after_step=_crash_at(3), **XE)
    assert not (ws / "xe" / "att2in-small-v2" / "manifest.json").exists()

    moved = tmp_path / "elsewhere" / "runs"
    moved.parent.mkdir()
    shutil.move(ws, moved)
    capsys.readouterr()

    r = rdpp("score", "--metrics", "CIDEr", "--workspace", moved)
    assert r.exit_code == 0, r.output
    r = rdpp("sample", "--n", "3", "--workspace", moved, "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = rdpp("score", "--metrics", "CIDEr", "--workspace", moved)
    assert r.exit_code == 0, r.output
    scores = read_artifact(moved / "scores" / "att2in-small-v1.random-n3-v1")
    assert [i["path"] for i in scores.inputs] == ["samples/att2in-small-v1.random-n3-v1", "data/tiny-v1"]
    r = rdpp("ls", "--workspace", moved)
    assert r.exit_code == 0 and "scores/att2in-small-v1.random-n2-v1" in r.output, r.output
    assert str(ws) not in r.output.replace("\n", "")
    assert rdpp("verify", "--workspace", moved).exit_code == 0

    # the killed run resumes in its own folder (its identity is content: no path changed it), not a new version
    resumed = train_xe("tiny-v1", workspace=moved, epochs=2, save_every_steps=1, **XE)
    assert resumed.path == moved / "xe" / "att2in-small-v2"
    assert "resuming unfinished" in capsys.readouterr().err
    assert sorted(p.name for p in (moved / "xe").iterdir()) == ["att2in-small-v1", "att2in-small-v2"]
    assert xe.inputs[0]["path"] == "data/tiny-v1"  # inputs are recorded relative to the workspace


def test_an_input_renamed_inside_the_workspace_is_found_by_its_hash(tmp_path, capsys):
    ws = tmp_path / "runs"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3)
    train_xe("tiny-v1", workspace=ws, epochs=1, **{**XE, "val_images": 0})
    assert rdpp("sample", "--n", "2", "--workspace", ws, "--device", "cpu").exit_code == 0
    (ws / "data" / "tiny-v1").rename(ws / "data" / "renamed-v1")
    capsys.readouterr()
    r = rdpp("score", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    assert "found it by its manifest hash" in r.output and "renamed-v1" in r.output
    man = json.loads((ws / "scores" / "att2in-small-v1.random-n2-v1" / "manifest.json").read_text())
    assert man["inputs"][1]["path"] == "data/renamed-v1"
