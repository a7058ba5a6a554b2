"""Names that tell (docs/workspace.md): samples and scores are named after their parent, `rdpp ls`
shows the model behind them, and `--from` names the parent artifact in every command."""

from __future__ import annotations

import os

import pytest

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.ls import ls

from helpers import error_line, model_artifact, rdpp, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.unit
def test_one_version_pattern():
    from rdpp_cli.artifacts import split_version, version_name

    assert version_name("toy", 1) == "toy-v1" and version_name("toy", 12) == "toy-v12"
    assert split_version("dpp-m5-v1.random-n20-v3") == ("dpp-m5-v1.random-n20", 3)
    assert split_version("toy") is None and split_version("toy-v0") is None
    # a stem that is an artifact name is its own first version (the scores of those samples)
    assert version_name("dpp-m5-v1.random-n20-v3", 1) == "dpp-m5-v1.random-n20-v3"
    assert version_name("dpp-m5-v1.random-n20-v3", 2) == "dpp-m5-v1.random-n20-v3-v2"
    assert split_version("dpp-m5-v1.random-n20-v3-v2") == ("dpp-m5-v1.random-n20-v3", 2)


@pytest.mark.integration
def test_samples_and_scores_are_named_after_their_parent(tmp_path):
    ws = tmp_path / "runs"
    data = read_artifact(write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3))
    model_artifact(ws, data, group="xe", name="att2in")
    model_artifact(ws, data, group="finetune", name="dpp-m5", seed=1)

    def run(*args):
        r = rdpp(*args, "--workspace", ws)
        assert r.exit_code == 0, r.output
        return r

    run("sample", "--from", "att2in-v1", "--n", "2", "--device", "cpu")
    run("sample", "--from", "dpp-m5-v1", "--n", "2", "--device", "cpu")
    run("sample", "finetune/dpp-m5-v1", "--n", "2", "--seed", "1", "--device", "cpu")  # group/name as ls shows
    assert sorted(p.name for p in (ws / "samples").iterdir()) == [
        "att2in-v1.random-n2-v1", "dpp-m5-v1.random-n2-v1", "dpp-m5-v1.random-n2-v2"]
    run("score", "--from", "dpp-m5-v1.random-n2-v2", "--metrics", "CIDEr")
    run("score", "samples/att2in-v1.random-n2-v1", "--metrics", "CIDEr")
    run("score", "--from", "att2in-v1.random-n2-v1", "--metrics", "CIDEr", "--oracle")  # a second scoring
    assert sorted(p.name for p in (ws / "scores").iterdir()) == [
        "att2in-v1.random-n2-v1", "att2in-v1.random-n2-v1-v2", "dpp-m5-v1.random-n2-v2"]
    scored = read_artifact(ws / "scores" / "dpp-m5-v1.random-n2-v2").input_of_kind("rdpp.samples")
    assert scored["manifest_sha256"] == read_artifact(ws / "samples" / "dpp-m5-v1.random-n2-v2").manifest_sha256

    # rdpp ls: the model behind every samples and scores artifact
    cols = {c.header: list(c._cells) for c in ls(ws).columns}
    model_of = dict(zip(cols["artifact"], cols["model"]))
    assert model_of["samples/dpp-m5-v1.random-n2-v2"] == "finetune/dpp-m5-v1"
    assert model_of["scores/dpp-m5-v1.random-n2-v2"] == "finetune/dpp-m5-v1"
    assert model_of["scores/att2in-v1.random-n2-v1-v2"] == "xe/att2in-v1"
    assert model_of["data/tiny-v1"] == "-"

    # MODEL and --from are one option: two different names are refused
    line = error_line(rdpp("score", "att2in-v1.random-n2-v1", "--from", "dpp-m5-v1.random-n2-v2", "--workspace", ws))
    assert "SAMPLES att2in-v1.random-n2-v1 and --from dpp-m5-v1.random-n2-v2 name different samples" in line
