"""Lineage by content (docs/workspace.md#lineage-inputs-by-content): a stage combines only artifacts that belong together
(by manifest hash, not image ids or paths), opens recorded inputs only when their manifest hash still
matches, and `rdpp verify` finds missing or changed files, changed inputs and broken lineage."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import pytest

from rdpp_cli.artifacts import read_artifact, write_manifest
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.errors import RdppError

from helpers import error_line, listing, model_artifact, rdpp, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """tiny-v1 and tiny-v2 hold the same image ids (1000...) with other references; a model trained
    on tiny-v1 and its samples."""
    ws = tmp_path_factory.mktemp("ws")
    d1 = read_artifact(write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=3))
    write_tiny_data(ws / "data" / "tiny-v2", n_train=8, n_val=2, n_test=3, seed=1, templates=["one {c} {s}"])
    model_artifact(ws, d1)
    r = rdpp("sample", "--n", "2", "--workspace", ws, "--device", "cpu")
    assert r.exit_code == 0, r.output
    return ws


def _rewrite_manifest(path: Path, **summary) -> None:
    """Change an artifact's manifest (and so its manifest hash) as a careless edit would."""
    man = json.loads((path / "manifest.json").read_text())
    man.setdefault("summary", {}).update(summary)
    (path / "manifest.json").write_text(json.dumps(man))


# -- item 1: combining artifacts checks lineage by content -------------------------------------------

@pytest.mark.integration
def test_score_against_the_references_of_another_data_artifact_warns(ws):
    before = listing(ws)
    other = ws.parent / "other"
    r = rdpp("score", "--data", "tiny-v2", "--metrics", "CIDEr", "--out", other, "--workspace", ws)
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "made from data artifact data/tiny-v1" in warn[0] and "data/tiny-v2" in warn[0]
    assert read_artifact(other).input_of_kind("rdpp.data")["manifest_sha256"] == \
        read_artifact(ws / "data" / "tiny-v2").manifest_sha256
    assert listing(ws) == before  # nothing written in the workspace
    # the samples' own data artifact, by default or named, without a warning
    r = rdpp("score", "--data", "tiny-v1", "--metrics", "CIDEr", "--out", ws.parent / "own", "--workspace", ws)
    assert r.exit_code == 0 and "warning:" not in r.output, r.output
    assert read_artifact(ws.parent / "own").input_of_kind("rdpp.data")["manifest_sha256"] == \
        read_artifact(ws / "data" / "tiny-v1").manifest_sha256


@pytest.mark.unit
def test_data_artifact_refuses_features_of_other_images(tmp_path):
    path = write_tiny_data(tmp_path / "d", n_train=4, n_val=1, n_test=1)
    DataArtifact.open(path)
    with h5py.File(path / "features.h5", "r+") as f:  # same size on disk: only the ids are swapped
        ids = f["image_ids"][:]
        f["image_ids"][:2] = ids[:2][::-1]
    with pytest.raises(RdppError, match=r"features\.h5 changed after its artifact was written"):
        DataArtifact.open(path)
    # an artifact written that way (its manifest lists these files) is refused for what it holds
    write_manifest(path, "rdpp.data", {"source": "tiny-test"})
    with pytest.raises(RdppError, match=r"features\.h5 and captions\.h5 do not hold the same images.*"
                                        r"row 0: image 1001 in features\.h5, 1000 in captions\.h5.*remake"):
        DataArtifact.open(path)


# -- item 6: recorded input hashes are checked when a stage opens an input, and by rdpp verify ------

@pytest.mark.integration
def test_a_stage_refuses_an_input_that_changed_after_it_was_recorded(ws, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(ws, copy)
    _rewrite_manifest(copy / "data" / "tiny-v1", note="edited")
    line = error_line(rdpp("score", "--metrics", "CIDEr", "--workspace", copy))
    assert "data/tiny-v1 changed after" in line and "manifest hash differs" in line
    assert not (copy / "scores").exists()
    line = error_line(rdpp("sample", "--n", "2", "--workspace", copy, "--device", "cpu"))
    assert "data/tiny-v1 changed after" in line


@pytest.mark.integration
def test_verify_lists_changed_and_missing_files_and_broken_lineage(ws, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(ws, copy)
    r = rdpp("verify", "--workspace", copy)
    assert r.exit_code == 0, r.output
    assert "4 artifact(s) checked" in r.output and "0 with problems" in r.output
    samples = next((copy / "samples").iterdir())
    body = (samples / "samples.json").read_bytes()
    (samples / "samples.json").write_bytes(body.replace(b'"captions"', b'"Captions"', 1))  # same size
    (copy / "data" / "tiny-v2" / "vocab.json").unlink()
    r = rdpp("verify", "--workspace", copy)
    assert r.exit_code == 1, r.output
    assert "samples.json: sha256" in r.output and "does not match the manifest" in r.output
    assert "vocab.json: missing" in r.output and "2 with problems" in r.output
    # --quick reads no file: sizes, and the hashes remembered when the files were last hashed
    r = rdpp("verify", "--quick", "--workspace", copy)
    assert r.exit_code == 1 and "samples.json: sha256" in r.output and "2 with problems" in r.output
    # an input moved inside the workspace is found by its hash; one that changed or is gone is not
    (copy / "data" / "tiny-v1").rename(copy / "data" / "moved-v1")
    r = rdpp("verify", "xe/att2in-v1", "--workspace", copy)
    assert r.exit_code == 0, r.output
    _rewrite_manifest(copy / "data" / "moved-v1", note="edited")
    r = rdpp("verify", "att2in-v1", "--workspace", copy)
    assert r.exit_code == 1 and "input data/tiny-v1" in r.output and "is missing" in r.output, r.output
    r = rdpp("verify", "no-such-thing", "--workspace", copy)
    assert "artifact 'no-such-thing' not found" in error_line(r)


@pytest.mark.unit
def test_an_older_schema_names_the_command_that_remakes_it(tmp_path):
    path = write_tiny_data(tmp_path / "d", n_train=4, n_val=1, n_test=1)
    man = json.loads((path / "manifest.json").read_text())
    for schema, match in ((0, r"schema 0, older than this rdpp reads .*remake it with `rdpp prepro toy` or "
                               r"`rdpp prepro coco`"),
                          (99, r"schema 99, newer than this rdpp .*upgrade rdpp")):
        (path / "manifest.json").write_text(json.dumps({**man, "schema": schema}))
        with pytest.raises(RdppError, match=match):
            read_artifact(path, "rdpp.data")
