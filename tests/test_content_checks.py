"""Content, not just size, on every read; samples scored against their own data; external files by
content; `rdpp verify` sees every folder and propagates a change down the lineage.

One 20-image toy workspace (data, an XE model, a fine-tuned model, samples of the XE model and their
scores) is built once for the module; each test edits a copy. A same-size edit of every kind of
input, through every stage that reads it, must be refused with one line that names the file, says
the sha256 differs at the same size and points to `rdpp verify`, and must write nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from rdpp_cli.artifacts import content_hash, read_artifact, sha256_file
from rdpp_cli.data.features import FeatureWriter
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.decoding.sample import sample
from rdpp_cli.errors import RdppError
from rdpp_cli.scoring.score import score
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.xe import train_xe

from helpers import error_line, headless_mobilenet, listing, model_artifact, rdpp

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

XE, FT = "xe/att2in-small-v1", "finetune/scst-v1"
SAMPLES = "samples/att2in-small-v1.random-n2-v1"
TRAIN = ["--epochs", "1", "--batch-size", "8", "--val-images", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    ws = tmp_path_factory.mktemp("content") / "runs"
    prepro_toy(workspace=ws, images=20)
    train_xe(workspace=ws, preset="small", epochs=1, batch_size=8, val_images=2, device="cpu")
    finetune(XE.split("/")[1], workspace=ws, reward="scst", epochs=1, batch_size=8, val_images=2, device="cpu")
    sample(ws / XE, n=2, device="cpu", workspace=ws)
    score(ws / SAMPLES, metrics="CIDEr", workspace=ws)
    return ws


@pytest.fixture
def ws(built, tmp_path) -> Path:
    copy = tmp_path / "runs"
    shutil.copytree(built, copy)
    return copy


VERIFIED = ".rdpp-verified.json"  # artifacts.verified.VERIFIED (imported in the tests of it: checked on main)


def same_size(path: Path, edit) -> None:
    """Apply ``edit(path)`` and check the file kept its size (what the size check cannot see)."""
    before, body = path.stat().st_size, path.read_bytes()
    edit(path)
    assert path.stat().st_size == before and path.read_bytes() != body


def edit_captions(p: Path) -> None:  # the test images' references start with word 1 (issue 21, case 1a)
    with h5py.File(p, "r+") as f:
        test = np.flatnonzero(f["split"][:] == b"test")
        for i in test:
            f["labels"][f["label_start"][i]:f["label_end"][i], 0] = 1


def edit_vocab(p: Path) -> None:
    words = json.loads(p.read_text())["words"]
    w = max(words, key=len)
    p.write_text(p.read_text().replace(f'"{w}"', f'"{w[::-1]}"', 1))


def edit_df(p: Path) -> None:
    with h5py.File(p, "r+") as f:
        f["df"][:] = f["df"][:] * 2


def edit_features(p: Path) -> None:
    with h5py.File(p, "r+") as f:
        f["att"][3] = f["att"][3] + 1


def edit_samples(p: Path) -> None:  # the first caption's first letter
    body = p.read_bytes()
    k = body.index(b'"', body.index(b'"captions": [') + len(b'"captions": [')) + 1
    p.write_bytes(body[:k] + (b"x" if body[k:k + 1] != b"x" else b"y") + body[k + 1:])


def finetuned_over_xe(p: Path) -> None:  # issue 21, case 1c
    shutil.copyfile(p.parents[3] / FT / "checkpoints" / "best.pt", p)


EDITS = {
    "captions.h5": ("data/toy-v1/captions.h5", edit_captions),
    "vocab.json": ("data/toy-v1/vocab.json", edit_vocab),
    "cider_df.h5": ("data/toy-v1/cider_df.h5", edit_df),
    "features.h5": ("data/toy-v1/features.h5", edit_features),
    "best.pt": (f"{XE}/checkpoints/best.pt", finetuned_over_xe),
    "samples.json": (f"{SAMPLES}/samples.json", edit_samples),
}
STAGES = {
    "score": lambda ws: ["score", ws / SAMPLES, "--metrics", "CIDEr"],
    "score samples.json": lambda ws: ["score", ws / SAMPLES / "samples.json", "--metrics", "CIDEr"],
    "finetune": lambda ws: ["finetune", "--from", XE, "--reward", "scst", *TRAIN],
    "train-xe": lambda ws: ["train-xe", "--data", "toy-v1", "--preset", "small", *TRAIN],
    "train-xe --init-from": lambda ws: ["train-xe", "--data", "toy-v1", "--init-from", XE, *TRAIN],
    "sample": lambda ws: ["sample", "--from", XE, "--n", "2", "--device", "cpu"],
}
CASES = [  # every stage that reads each kind of file (1a: captions.h5/score, 1b: /finetune, 1c: best.pt/sample)
    ("captions.h5", "score"), ("captions.h5", "finetune"), ("captions.h5", "train-xe"), ("captions.h5", "sample"),
    ("vocab.json", "sample"), ("vocab.json", "train-xe"),
    ("cider_df.h5", "finetune"), ("cider_df.h5", "train-xe"), ("cider_df.h5", "score"),
    ("features.h5", "sample"), ("features.h5", "train-xe"), ("features.h5", "finetune"),
    ("best.pt", "sample"), ("best.pt", "finetune"), ("best.pt", "train-xe --init-from"),
    ("samples.json", "score"), ("samples.json", "score samples.json"),
]


@pytest.mark.parametrize("kind,stage", CASES)
def test_a_same_size_edit_is_refused_by_every_stage_that_reads_the_file(ws, kind, stage):
    rel, edit = EDITS[kind]
    same_size(ws / rel, edit)
    before = listing(ws)
    line = error_line(rdpp(*STAGES[stage](ws), "--workspace", ws))
    assert f"{rel} changed after its artifact was written" in line, line
    assert "same size" in line and "sha256" in line and "`rdpp verify`" in line, line
    assert listing(ws) == before  # nothing written


def test_a_file_edited_after_it_was_read_is_refused_at_the_next_read(ws):
    """The remembered hash belongs to one version of the file: an edit gives it another mtime."""
    assert rdpp("sample", "--from", XE, "--n", "2", "--device", "cpu", "--workspace", ws).exit_code == 0
    same_size(ws / "data/toy-v1/features.h5", edit_features)
    line = error_line(rdpp("sample", "--from", XE, "--n", "3", "--device", "cpu", "--workspace", ws))
    assert "data/toy-v1/features.h5 changed after" in line


@pytest.mark.parametrize("rel, edit", [("data/toy-v1/captions.h5", "edit_captions"),
                                       ("data/toy-v1/features.h5", "edit_features")])
def test_an_edit_whose_mtime_was_set_back_is_still_seen(ws, rel, edit):
    """``touch -r backup file`` after a same-size edit restores size, mtime and inode: the ctime,
    which no one can set back, tells the remembered hash apart from the new content."""
    assert rdpp("sample", "--from", XE, "--n", "2", "--device", "cpu", "--workspace", ws).exit_code == 0
    p = ws / rel
    st = p.stat()
    time.sleep(0.01)  # a ctime tick later than the read's
    same_size(p, globals()[edit])
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r
    assert (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    line = error_line(rdpp("sample", "--from", XE, "--n", "3", "--device", "cpu", "--workspace", ws))
    assert f"{rel} changed after" in line, line


def test_an_unchanged_file_is_hashed_once_and_remembered_by_size_mtime_and_inode(ws):
    from rdpp_cli.artifacts import verified

    art = read_artifact(ws / "data" / "toy-v1")
    art.file("captions.h5")
    p = ws / "data" / "toy-v1" / "captions.h5"
    kept = json.loads((art.path / verified.VERIFIED).read_text())["captions.h5"]
    assert kept == {"key": verified.stat_key(p), "hash_of": "file", "sha256": art.manifest["files"]["captions.h5"]["sha256"]}
    assert kept["key"] == [p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino, p.stat().st_ctime_ns]
    # an unchanged file is not hashed again: a (made-up) wrong remembered hash is what decides ...
    (art.path / verified.VERIFIED).write_text(json.dumps({"captions.h5": {**kept, "sha256": "0" * 64}}))
    verified._SEEN.clear()  # as a new process
    with pytest.raises(RdppError, match="captions.h5 changed after"):
        art.file("captions.h5")
    # ... until the file is another version on disk (here: touched), which is hashed again
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 1000))
    assert art.file("captions.h5") == p
    assert json.loads((art.path / verified.VERIFIED).read_text())["captions.h5"]["key"] == verified.stat_key(p)
    # the hidden file is never one of the artifact's files
    assert verified.VERIFIED not in art.manifest["files"]


def test_a_folder_rdpp_cannot_write_to_is_checked_without_remembering(ws):
    from rdpp_cli.artifacts import verified

    data = ws / "data" / "toy-v1"
    (data / verified.VERIFIED).unlink(missing_ok=True)
    (data / verified.VERIFIED).mkdir()  # nothing can be written there
    verified._SEEN.clear()
    assert read_artifact(data).file("vocab.json") == data / "vocab.json"
    same_size(data / "vocab.json", edit_vocab)
    with pytest.raises(RdppError, match="vocab.json changed after"):
        read_artifact(data).file("vocab.json")


def test_a_new_artifact_remembers_the_hashes_its_writer_computed(built):
    from rdpp_cli.artifacts import verified

    for rel in ("data/toy-v1", XE, SAMPLES):
        art = read_artifact(built / rel)
        kept = json.loads((art.path / verified.VERIFIED).read_text())
        for name, entry in art.manifest["files"].items():
            assert kept[name]["sha256"] == entry["sha256"]
            assert kept[name]["key"] == verified.stat_key(art.path / name)
    assert kept_features(built)["hash_of"].startswith("h5rows:")


def kept_features(ws: Path) -> dict:
    return json.loads((ws / "data" / "toy-v1" / VERIFIED).read_text())["features.h5"]


@pytest.mark.parametrize("att_len", [False, True])
def test_the_row_block_hash_read_back_in_parallel_is_the_one_written(tmp_path, att_len):
    rng = np.random.default_rng(0)
    n, regions, dim = 23, 6, 5
    w = FeatureWriter(tmp_path / "f.h5", np.arange(100, 100 + n), fc_dim=dim, regions=regions, block=4,
                      with_att_len=att_len)
    for s in range(0, n, 4):
        k = min(4, n - s)
        w.write(rng.normal(size=(k, dim)), rng.normal(size=(k, regions, dim)), rng.integers(1, regions, k))
    entry = w.finish()
    for threads in (1, 3):
        assert content_hash.recompute(tmp_path / "f.h5", entry["hash_of"], threads=threads) == entry["sha256"]
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert all(content_hash.row_extents(f[d], tmp_path / "f.h5") is not None for d in ("fc", "att", "image_ids"))
        digests = [content_hash.block_digest([f[d][s:s + 4] for d in ("fc", "att", *(["att_len"] if att_len else []),
                                                                           "image_ids")]) for s in range(0, n, 4)]
    assert content_hash.combine(digests) == entry["sha256"]
    # a layout h5py alone reads (gzip chunks) gives the same hash by the slow path
    with h5py.File(tmp_path / "f.h5", "r") as f, h5py.File(tmp_path / "g.h5", "w") as g:
        for d in f:
            g.create_dataset(d, data=f[d][:], compression="gzip" if f[d].ndim > 1 else None)
        assert content_hash.row_extents(g["att"], tmp_path / "g.h5") is None
    assert content_hash.recompute(tmp_path / "g.h5", entry["hash_of"]) == entry["sha256"]


# -- item 2: an artifact's inputs are its manifest's inputs (case 1f) ------------------------------

def scores_of(path: Path) -> dict:
    return json.loads((path / "scores.json").read_text())


def test_a_samples_json_is_scored_against_its_own_data_not_the_newest(ws):
    prepro_toy(workspace=ws, images=20, seed=1)  # data/toy-v2, newer, other images' references
    r = rdpp("score", ws / SAMPLES / "samples.json", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    new = read_artifact(ws / "scores" / "att2in-small-v1.random-n2-v1-v2")  # named after the samples
    own = read_artifact(ws / "scores" / "att2in-small-v1.random-n2-v1")
    data = read_artifact(ws / "data" / "toy-v1")
    assert [i["manifest_sha256"] for i in new.inputs] == [read_artifact(ws / SAMPLES).manifest_sha256,
                                                          data.manifest_sha256]
    assert scores_of(new.path)["accuracy"]["CIDEr"] == scores_of(own.path)["accuracy"]["CIDEr"]
    r = rdpp("ls", "--workspace", ws)
    row = next(ln for ln in r.output.splitlines() if "scores/att2in-small-v1.random-n2-v1-v2" in ln)
    assert XE in row, row


def test_data_overrides_the_samples_own_with_a_warning_naming_both(ws):
    prepro_toy(workspace=ws, images=20, seed=0, batch_size=50)  # data/toy-v2: same images, other artifact
    r = rdpp("score", ws / SAMPLES, "--data", "toy-v2", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "data/toy-v1" in warn[0] and "data/toy-v2" in warn[0], r.output
    new = read_artifact(ws / "scores" / "att2in-small-v1.random-n2-v1-v2")
    assert new.inputs[1]["manifest_sha256"] == read_artifact(ws / "data" / "toy-v2").manifest_sha256


def test_the_newest_hint_names_the_option_that_picks_it(ws, tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text((ws / SAMPLES / "samples.json").read_text())
    r = rdpp("score", plain, "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    assert "(newest in" in r.output and "--data to pick another" in r.output, r.output


# -- item 5: rdpp verify sees everything (cases 1a and 5d) ------------------------------------------

def verdicts(output: str) -> dict[str, str]:
    rows = {}
    for ln in output.splitlines():
        cells = [c.strip() for c in ln.split("│")]
        if len(cells) > 5 and "/" in cells[1]:
            rows[cells[1]] = cells[5]
    return rows


def test_verify_reports_a_changed_input_and_everything_made_from_it(ws):
    assert rdpp("verify", "--workspace", ws).exit_code == 0  # hashes every file, and remembers them
    same_size(ws / "data/toy-v1/captions.h5", edit_captions)
    for args in ((), ("--quick",)):
        r = rdpp("verify", *args, "--workspace", ws)
        assert r.exit_code == 1, r.output
        rows = verdicts(r.output)
        assert "captions.h5" in rows["data/toy-v1"], r.output
        for rel in (XE, FT, SAMPLES, "scores/att2in-small-v1.random-n2-v1"):
            assert rows[rel].startswith("made from data/toy-v1, which has a problem (captions.h5"), (rel, r.output)
        assert "5 artifact(s) checked" in r.output and "5 with problems" in r.output
    # a named descendant is checked with its ancestors
    r = rdpp("verify", SAMPLES, "--quick", "--workspace", ws)
    assert r.exit_code == 1 and "made from data/toy-v1" in r.output, r.output


def test_verify_and_ls_report_a_folder_without_manifest(ws):
    scores = ws / "scores" / "att2in-small-v1.random-n2-v1"
    (scores / "manifest.json").unlink()  # case 5d
    unfinished = ws / "xe" / "att2in-small-v2"
    unfinished.mkdir()
    (unfinished / ".rdpp-partial.json").write_text(json.dumps({"kind": "rdpp.model", "config": {}}))
    r = rdpp("verify", "--workspace", ws)
    assert r.exit_code == 1, r.output
    rows = verdicts(r.output)
    assert rows["scores/att2in-small-v1.random-n2-v1"].startswith("no manifest.json"), r.output
    assert rows["xe/att2in-small-v2"] == "unfinished run", r.output
    assert "1 with problems" in r.output and "1 unfinished run(s)" in r.output
    r = rdpp("ls", "--workspace", ws)
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1, r.output
    assert "scores/att2in-small-v1.random-n2-v1 (no manifest.json)" in notes[0]
    assert "xe/att2in-small-v2 (unfinished run)" in notes[0]
    (unfinished / ".rdpp-partial.json").unlink()
    (scores / "manifest.json").write_text("{not json")
    r = rdpp("verify", "--workspace", ws)
    assert r.exit_code == 1 and "is not valid JSON" in r.output, r.output


def test_quick_is_defined_in_the_help():
    r = rdpp("verify", "--help")
    text = " ".join(r.output.split())
    assert "--quick" in text and "remembered" in text and "mtime or inode" in text


# -- item 4: external files by content (case 4d) ----------------------------------------------------

@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """A toy data artifact extracted with a user's weights file (a random MobileNetV2) given as a path
    relative to the folder prepro ran in, and an (untrained) model on it."""
    root = tmp_path_factory.mktemp("cnn")
    weights = headless_mobilenet(root / "mnv2.pth")
    here = Path.cwd()
    os.chdir(root)
    try:
        data = prepro_toy(workspace=Path("runs"), images=20, backbone="mobilenet_v2", weights=Path("mnv2.pth"),
                          image_size=32, att_size=2)
    finally:
        os.chdir(here)
    data = read_artifact(root / "runs" / "data" / data.name)
    model_artifact(root / "runs", data)
    return root


def caption_cmd(ws: Path, out: Path, *extra):
    photo = next((ws / "data" / "toy-v1" / "source" / "images").glob("*.png"))
    return ["caption", photo, "--method", "greedy", "--device", "cpu", "--workspace", ws, "--out", out, *extra]


def test_weights_are_recorded_by_sha256_and_a_path_any_folder_finds(cnn, tmp_path, monkeypatch):
    cfg = read_artifact(cnn / "runs" / "data" / "toy-v1").config
    assert cfg["weights"] == str((cnn / "mnv2.pth").resolve())  # outside the workspace: absolute
    assert cfg["weights_sha256"] == sha256_file(cnn / "mnv2.pth")
    monkeypatch.chdir(tmp_path)  # another working folder
    r = rdpp(*caption_cmd(cnn / "runs", tmp_path / "c"))
    assert r.exit_code == 0, r.output


def test_another_weights_file_at_the_recorded_path_is_refused(cnn, tmp_path):
    w = cnn / "mnv2.pth"
    shutil.copyfile(w, tmp_path / "keep.pth")
    try:
        torch.save(torch.load(w, weights_only=True) | {"features.0.0.weight": torch.zeros(32, 3, 3, 3)}, w)
        line = error_line(rdpp(*caption_cmd(cnn / "runs", tmp_path / "c")))
        assert f"weights file {w.resolve()} is not the one data artifact" in line, line
        other = tmp_path / "other.pth"
        shutil.copyfile(w, other)
        line = error_line(rdpp(*caption_cmd(cnn / "runs", tmp_path / "c", "--weights", other)))
        assert f"weights file {other} is not the one" in line
        w.unlink()  # gone: the message says which file it needs
        line = error_line(rdpp(*caption_cmd(cnn / "runs", tmp_path / "c")))
        assert "does not exist" in line and f"sha256 {sha256_file(tmp_path / 'keep.pth')}" in line, line
        assert not (tmp_path / "c").exists()
    finally:
        shutil.copyfile(tmp_path / "keep.pth", w)


def test_weights_inside_the_workspace_move_with_it(cnn, tmp_path):
    ws = tmp_path / "runs"
    (ws / "weights").mkdir(parents=True)
    shutil.copyfile(cnn / "mnv2.pth", ws / "weights" / "mnv2.pth")
    prepro_toy(workspace=ws, images=20, backbone="mobilenet_v2", weights=ws / "weights" / "mnv2.pth",
               image_size=32, att_size=2)
    data = read_artifact(ws / "data" / "toy-v1")
    assert data.config["weights"] == "weights/mnv2.pth"
    model_artifact(ws, data)
    moved = tmp_path / "elsewhere"
    shutil.move(ws, moved)
    r = rdpp(*caption_cmd(moved, tmp_path / "c"))
    assert r.exit_code == 0, r.output
