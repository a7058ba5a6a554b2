"""Options that cannot run are refused in one line before any folder is claimed: Adam's beta2 outside
[0, 1) and eps not above 0 (torch would crash on the first, and the second used to be blamed on the
learning rate), the Noam schedule on a model without d_model; and a workspace that is a file (or an
--out under a file) says so, instead of "Not a directory; ... rerun to resume"."""

from __future__ import annotations

import pytest

from helpers import error_line, listing, rdpp, write_tiny_data

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("claim") / "ws"
    write_tiny_data(root / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2)
    return root


@pytest.mark.parametrize("args, said", [
    (["--adam-beta2", "1.0"], "--adam-beta2 must be in [0, 1) (got 1.0)"),
    (["--adam-eps", "0"], "--adam-eps must be a positive number (got 0.0)"),
    (["--adam-eps", "-1e-8"], "--adam-eps must be a positive number"),
    (["--model", "updown", "--lr-schedule", "noam"], "--lr-schedule noam scales by the model's d_model, which UpDown"),
    (["--model", "att2in", "--lr-schedule", "noam"], "which Att2in does not have; use --lr-schedule step"),
])
def test_a_training_run_that_cannot_run_is_refused_before_its_folder(ws, args, said):
    before = listing(ws)
    line = error_line(rdpp("train-xe", "--workspace", ws, "--preset", "small", "--epochs", "1", "--device", "cpu",
                           *args))
    assert said in line, line
    assert listing(ws) == before  # no xe/ folder claimed, nothing written


def test_a_workspace_that_is_a_file_is_said_to_be_one(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    for args in (["prepro", "toy", "--images", "20"], ["ls"], ["verify"]):
        line = error_line(rdpp(*args, "--workspace", afile))
        assert f"workspace {afile} (--workspace) is a file, not a folder; pass --workspace DIR" in line, line
        assert "Not a directory" not in line and "rerun" not in line
    line = error_line(rdpp("prepro", "toy", "--images", "20", "--workspace", afile / "ws"))
    assert f"{afile} is a file, not a folder, so the workspace folder {afile / 'ws' / 'data'} cannot be made" in line
    line = error_line(rdpp("prepro", "toy", "--images", "20", "--out", afile / "toy"))
    assert f"{afile} is a file, not a folder, so --out {afile / 'toy'} cannot be made under it" in line, line
    assert afile.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [afile]
