"""Nothing a stage reads can be destroyed by what it writes (docs/workspace.md, ``--out``): an ``--out`` equal to,
inside or above anything the stage reads (artifact folders, a samples JSON, ``--refs``, photos) is
refused even with ``--force``, before anything is touched; ``--force`` replaces only an artifact of
the same stage. Every refusal is one ``error:`` line and leaves every file as it was."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.toy import prepro_toy

from helpers import error_line, model_artifact, rdpp

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """toy-v1 (20 images, pixstats features: `rdpp caption` can use it), an untrained model on it, and
    its samples; photos/ holds two of the toy images."""
    root = tmp_path_factory.mktemp("out")
    ws = root / "runs"
    data = prepro_toy(workspace=ws, images=20, batch_size=10)
    model_artifact(ws, data)
    r = rdpp("sample", "--n", "2", "--workspace", ws, "--device", "cpu")
    assert r.exit_code == 0, r.output
    photos = root / "photos"
    photos.mkdir()
    for p in sorted((data.path / "source" / "images").rglob("*.png"))[:2]:
        shutil.copy(p, photos / p.name)
    return ws


def contents(*roots: Path) -> dict[str, bytes]:
    """Every file under ``roots`` with its bytes (to show that nothing changed)."""
    return {str(p): p.read_bytes() for root in roots for p in sorted(Path(root).rglob("*")) if p.is_file()}


SAMPLES = "samples/att2in-v1.random-n2-v1"


def refused(ws: Path, *args, watch: tuple[Path, ...] = ()) -> str:
    before = contents(ws, *watch)
    line = error_line(rdpp(*args, "--workspace", ws))
    assert contents(ws, *watch) == before, line
    return line


def test_score_out_over_its_own_samples_is_refused_even_with_force(ws):
    """Case 7a: `rdpp score X --out X --force` deleted X's samples.json."""
    x = ws / SAMPLES
    line = refused(ws, "score", x, "--out", x, "--force")
    assert line == f"error: --out {x} is {x}, which this stage reads; choose another --out (not even --force " \
                   "writes over a stage's input)"
    # inside it, and the folder above it, are refused too
    assert "lies inside" in refused(ws, "score", x, "--out", x / "scores", "--force")
    assert "holds" in refused(ws, "score", x, "--out", ws / "samples", "--force")
    read_artifact(x, "rdpp.samples").verify()


def test_score_out_over_a_samples_file_or_a_refs_file_is_refused(ws, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(ws / SAMPLES / "samples.json", mine / "captions.json")
    line = refused(ws, "score", mine / "captions.json", "--out", mine, "--force", watch=(mine,))
    assert f"--out {mine} holds {mine / 'captions.json'}, which this stage reads" in line
    ds = DataArtifact(read_artifact(ws / "data" / "toy-v1"))
    test = ds.split_indices("test")
    anns = [{"image_id": int(ds.image_ids[i]), "caption": c} for i, refs in zip(test, ds.references_raw(test))
            for c in refs]
    refs = tmp_path / "refs" / "captions_test.json"
    refs.parent.mkdir()
    refs.write_text(json.dumps({"annotations": anns}))
    line = refused(ws, "score", ws / SAMPLES, "--refs", refs, "--out", refs.parent, "--force", watch=(refs.parent,))
    assert f"--out {refs.parent} holds {refs}, which this stage reads" in line


@pytest.mark.parametrize("stage, reads", [
    (["sample", "--n", "2"], "xe/att2in-v1"),
    (["sample", "--n", "2"], "data/toy-v1"),
    (["train-xe", "--preset", "small", "--epochs", "1", "--val-images", "0"], "data/toy-v1"),
    (["finetune", "--epochs", "1", "--val-images", "0"], "xe/att2in-v1"),
    (["finetune", "--epochs", "1", "--val-images", "0"], "data/toy-v1"),
])
def test_out_equal_to_an_input_artifact_is_refused_even_with_force(ws, stage, reads):
    line = refused(ws, *stage, "--device", "cpu", "--out", ws / reads, "--force")
    assert f"--out {ws / reads} is {ws / reads}, which this stage reads" in line, line


def test_caption_out_over_the_photos_is_refused(ws):
    photos = ws.parent / "photos"
    line = refused(ws, "caption", photos, "--device", "cpu", "--out", photos, "--force", watch=(photos,))
    assert f"--out {photos} is {photos}, which this stage reads" in line, line


def test_force_replaces_only_an_artifact_of_the_same_stage(ws, tmp_path):
    # another kind: a model artifact is not replaced by samples, --force or not
    other = tmp_path / "model"
    shutil.copytree(ws / "xe" / "att2in-v1", other)
    line = refused(ws, "sample", "--n", "2", "--from", ws / "xe" / "att2in-v1", "--device", "cpu", "--out", other,
                   "--force", watch=(other,))
    assert f"{other} holds rdpp.model artifact, not rdpp.samples; choose another --out (--force replaces only an " \
           "artifact of the same stage)" in line, line
    # a folder of someone's files is never emptied
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    line = refused(ws, "sample", "--n", "2", "--device", "cpu", "--out", mine, "--force", watch=(mine,))
    assert "holds files that are not an rdpp artifact" in line and (mine / "thesis.tex").read_text() == "precious"
    # the same stage's artifact is replaced with --force, as before
    again = tmp_path / "samples"
    assert rdpp("sample", "--n", "2", "--device", "cpu", "--workspace", ws, "--out", again).exit_code == 0
    r = rdpp("sample", "--n", "2", "--seed", "1", "--device", "cpu", "--workspace", ws, "--out", again, "--force")
    assert r.exit_code == 0, r.output
    assert read_artifact(again, "rdpp.samples").config["seed"] == 1
