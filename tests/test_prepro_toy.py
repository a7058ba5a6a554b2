"""`rdpp prepro toy`: workspace versions, the artifact's files, the grammar, and what the features carry."""

import json
import os
import subprocess
import sys
from collections import Counter

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.toy import COLOURS, KINDS, NUMBER, PLACE, PLURAL, split_sizes

runner = CliRunner()
WIDE = {"COLUMNS": "250"}


@pytest.fixture(scope="module")
def default_toy(tmp_path_factory):
    """`python -m rdpp_cli prepro toy` with no options in an empty folder, then `rdpp ls` there."""
    cwd = tmp_path_factory.mktemp("empty")
    env = {**os.environ, "RDPP_NO_PROGRESS": "1", "COLUMNS": "250"}
    env.pop("RDPP_WORKSPACE", None)
    made = subprocess.run([sys.executable, "-m", "rdpp_cli", "prepro", "toy"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    listed = subprocess.run([sys.executable, "-m", "rdpp_cli", "ls"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    return cwd, made, listed


@pytest.mark.integration
def test_subprocess_prepro_toy_then_ls_in_an_empty_folder(default_toy):
    cwd, made, listed = default_toy
    assert made.returncode == 0, made.stderr
    path = cwd / "runs" / "data" / "toy-v1"
    assert (path / "manifest.json").is_file()
    assert "rdpp prepro toy" in made.stdout and "runs/data/toy-v1" in made.stdout
    assert listed.returncode == 0, listed.stderr
    assert "data/toy-v1" in listed.stdout and "images=3000" in listed.stdout


@pytest.mark.slow  # ~2 min on 2 cores: the default run's budget; the other tests here check the default toy data
@pytest.mark.integration
def test_default_toy_files_have_the_documented_shapes(default_toy):
    path = default_toy[0] / "runs" / "data" / "toy-v1"
    art = read_artifact(path, "rdpp.data")
    art.verify()
    n, m = 3000, 15000
    assert art.config["images"] == n and art.config["backbone"] == "pixstats"
    assert art.manifest["summary"] == {"images": n, "captions": m, "vocab": 42, "train": 2400, "val": 300, "test": 300,
                                       "word_count_threshold": 5, "unk_rate": 0.0, "unk_rate_train": 0.0,
                                       "clipped": 0.0}
    words = json.loads((path / "vocab.json").read_text())["words"]
    assert len(words) == 42 and words[-1] == "UNK"
    with h5py.File(path / "captions.h5", "r") as f:
        assert f["labels"].shape == (m, 16) and f["labels"].dtype == np.int32
        assert f["lengths"].shape == (m,) and f["lengths"][:].min() >= 1
        assert f["label_start"].shape == f["label_end"].shape == (n,)
        assert (f["label_end"][:] - f["label_start"][:] == 5).all()
        assert f["image_ids"][:].tolist() == list(range(1, n + 1))
        assert Counter(f["split"][:].tolist()) == {b"train": 2400, b"val": 300, b"test": 300}
        assert f["raw"].shape == (m,)
        ids = f["image_ids"][:]
    with h5py.File(path / "features.h5", "r") as f:
        assert f["fc"].shape == (n, 22) and f["fc"].dtype == np.float16
        assert f["att"].shape == (n, 64, 22) and f["att"].dtype == np.float16
        assert f["att"].chunks == (1, 64, 22)  # one chunk per image row
        assert "att_len" not in f
        assert (f["image_ids"][:] == ids).all()
        assert f.attrs["backbone"] == "pixstats" and int(f.attrs["att_size"]) == 8 and f.attrs["dtype"] == "float16"
        assert np.isfinite(f["att"][:50].astype(np.float32)).all()
    with h5py.File(path / "cider_df.h5", "r") as f:
        assert f["ngrams"].shape[1] == 4 and f["ngrams"].dtype == np.int32 and f["df"].dtype == np.float64
        assert int(f.attrs["num_docs"]) == 2400 and f["df"][:].max() <= 2400
    data = DataArtifact.open(path)  # the reader training and scoring use
    assert data.vocab_size == 42 and data.att_regions == 64
    assert data.decode(data.references_ids([0])[0][0]) == data.references_raw([0])[0][0]


@pytest.mark.integration
def test_versions_in_workspace_and_ls_shows_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RDPP_WORKSPACE", raising=False)
    r1 = runner.invoke(app, ["prepro", "toy", "--images", "40"], env=WIDE)
    assert r1.exit_code == 0, r1.output
    v1 = tmp_path / "runs" / "data" / "toy-v1"
    before = {p: p.read_bytes() for p in v1.rglob("*") if p.is_file()}
    r2 = runner.invoke(app, ["prepro", "toy", "--images", "40"], env=WIDE)
    assert r2.exit_code == 0, r2.output
    v2 = tmp_path / "runs" / "data" / "toy-v2"
    assert {p: p.read_bytes() for p in v1.rglob("*") if p.is_file()} == before
    a1, a2 = read_artifact(v1, "rdpp.data"), read_artifact(v2, "rdpp.data")
    a1.verify(), a2.verify()
    # same seed, same content: every file's hash agrees
    assert {k: v["sha256"] for k, v in a1.manifest["files"].items()} == \
        {k: v["sha256"] for k, v in a2.manifest["files"].items()}
    ls = runner.invoke(app, ["ls"], env=WIDE)
    assert ls.exit_code == 0, ls.output
    assert "data/toy-v1" in ls.stdout and "data/toy-v2" in ls.stdout
    # another seed gives other images
    r3 = runner.invoke(app, ["prepro", "toy", "--images", "40", "--seed", "1"], env=WIDE)
    assert r3.exit_code == 0, r3.output
    a3 = read_artifact(tmp_path / "runs" / "data" / "toy-v3", "rdpp.data")
    assert a3.manifest["files"]["features.h5"]["sha256"] != a1.manifest["files"]["features.h5"]["sha256"]


@pytest.mark.integration
def test_out_dir_and_config_file(tmp_path):
    cfg = tmp_path / "toy.yaml"
    cfg.write_text("images: 30\nseed: 3\n")
    out = tmp_path / "toy"
    r = runner.invoke(app, ["prepro", "toy", "--out", str(out), "--config", str(cfg), "--seed", "4"], env=WIDE)
    assert r.exit_code == 0, r.output
    art = read_artifact(out, "rdpp.data")
    art.verify()
    assert art.config["images"] == 30 and art.config["seed"] == 4  # flag beats file
    with h5py.File(out / "captions.h5", "r") as f:
        assert f["image_ids"].shape == (30,)
    assert split_sizes(30) == (24, 3, 3)


# ---- the grammar: 5 different, correct descriptions per image ------------------------------------

def _phrase_shapes(tokens):
    """Parse "a [size] [colour] kind|shape" noun phrases joined by "and" -> [(size, colour, kind)]."""
    out, i = [], 0
    while i < len(tokens):
        if tokens[i] == "and":
            i += 1
            continue
        assert tokens[i] == "a", tokens
        i += 1
        size = tokens[i] if tokens[i] in ("small", "large") else None
        i += size is not None
        colour = tokens[i] if tokens[i] in COLOURS else None
        i += colour is not None
        kind = tokens[i]
        assert kind in KINDS or kind == "shape", tokens
        out.append((size, colour, None if kind == "shape" else kind))
        i += 1
    return out


def _fits(np_, shape):
    size, colour, kind = np_
    return (size in (None, shape["size"]) and colour in (None, shape["colour"]) and kind in (None, shape["kind"]))


def _check(template, tokens, shapes):
    n = len(shapes)
    text = " ".join(tokens)
    if template == "list":
        nps = _phrase_shapes(tokens)
        assert len(nps) == n
        assert sorted((c, k) for _, c, k in nps) == sorted((s["colour"], s["kind"]) for s in shapes)
    elif template == "count":
        word = {1: "single", 2: "two", 3: "three"}[n]
        assert word in tokens and text in (f"{'a single shape' if n == 1 else word + ' shapes'} on a white background",
                                            f"there {'is' if n == 1 else 'are'} "
                                            f"{'a single shape' if n == 1 else word + ' shapes'} in the image")
    elif template == "relation":
        for rel in ("above", "below", "to the left of", "to the right of"):
            if f" {rel} " in text:
                left, right = text.split(f" {rel} ")
                (a,), (b,) = _phrase_shapes(left.split()), _phrase_shapes(right.split())
                pairs = [(s, t) for s in shapes for t in shapes if s is not t and _fits(a, s) and _fits(b, t)]
                ok = {"above": lambda s, t: s["row"] < t["row"], "below": lambda s, t: s["row"] > t["row"],
                      "to the left of": lambda s, t: s["row"] == t["row"] and s["col"] < t["col"],
                      "to the right of": lambda s, t: s["row"] == t["row"] and s["col"] > t["col"]}[rel]
                assert any(ok(s, t) for s, t in pairs), (text, shapes)
                break
        else:
            raise AssertionError(text)
    elif template == "detail":
        place = next(p for p in PLACE.values() if text.endswith(p))
        (np_,) = _phrase_shapes(text[: -len(place)].split())
        assert any(_fits(np_, s) and PLACE[(s["row"], s["col"])] == place for s in shapes), (text, shapes)
    elif template == "kinds":
        assert tokens[:3] == ["a", "picture", "of"]
        want = Counter(s["kind"] for s in shapes)
        got, words = Counter(), [t for t in tokens[3:] if t != "and"]
        for num, noun in zip(words[::2], words[1::2]):
            kind = noun if noun in KINDS else next(k for k, p in PLURAL.items() if p == noun)
            got[kind] += {v: k for k, v in NUMBER.items()}[num]
        assert got == want, (text, shapes)
    elif template == "colours":
        want = Counter(s["colour"] for s in shapes)
        got, words = Counter(), [t for t in tokens if t != "and"]
        for num, colour, noun in zip(words[::3], words[1::3], words[2::3]):
            assert noun == ("shape" if num == "a" else "shapes")
            got[colour] += {v: k for k, v in NUMBER.items()}[num]
        assert got == want, (text, shapes)
    else:
        raise AssertionError(template)


@pytest.mark.integration
def test_references_are_correct_and_genuinely_different(default_toy):
    source = default_toy[0] / "runs" / "data" / "toy-v1" / "source" / "dataset_toy.json"
    data = json.loads(source.read_text())
    assert len(data["images"]) == 3000
    n_distinct = []
    for img in data["images"]:
        shapes = img["shapes"]
        assert 1 <= len(shapes) <= 3
        assert len({(s["row"], s["col"]) for s in shapes}) == len(shapes)
        sents = img["sentences"]
        assert len(sents) == 5
        templates = [s["template"] for s in sents]
        assert len(set(templates)) == 5  # 5 templates apply even to a single shape
        for s in sents:
            assert s["raw"] == " ".join(s["tokens"])
            _check(s["template"], s["tokens"], shapes)
        n_distinct.append(len({s["raw"] for s in sents}))
    assert np.mean(np.array(n_distinct) == 5) > 0.95
    counts = Counter(len(img["shapes"]) for img in data["images"])
    assert min(counts.values()) > 900  # 1, 2 and 3 shapes about equally often


@pytest.mark.unit
def test_the_checker_rejects_wrong_descriptions():
    shapes = [{"kind": "circle", "colour": "red", "size": "small", "row": 0, "col": 0},
              {"kind": "square", "colour": "blue", "size": "large", "row": 2, "col": 0}]
    _check("relation", "a red circle above a blue square".split(), shapes)
    _check("relation", "a blue square below a red circle".split(), shapes)
    wrong = [("relation", "a red circle below a blue square"), ("relation", "a red circle to the left of a blue square"),
             ("list", "a red circle and a green square"), ("count", "three shapes on a white background"),
             ("detail", "a large red circle in the top left corner"), ("detail", "a small red circle at the top"),
             ("kinds", "a picture of two circles"), ("colours", "a red shape and a yellow shape")]
    for template, text in wrong:
        with pytest.raises(AssertionError):
            _check(template, text.split(), shapes)


# ---- the features carry what the captions speak of ------------------------------------------------

def _ridge_probe(x, ys, train, test, lam=10.0):
    """Least-squares one-vs-all classifiers (ridge, standardized inputs, one solve for every target
    in ``ys``): held-out accuracy of each."""
    x = torch.as_tensor(x, dtype=torch.float64)
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    x = torch.cat([(x - mu) / sd, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    onehots = [torch.nn.functional.one_hot(torch.as_tensor(y), int(y.max()) + 1).to(x.dtype) for y in ys]
    target = torch.cat(onehots, 1)
    a = x[train]
    scores = x[test] @ torch.linalg.solve(a.T @ a + lam * torch.eye(a.shape[1], dtype=x.dtype), a.T @ target[train])
    accs, k = [], 0
    for y, oh in zip(ys, onehots):
        accs.append(float((scores[:, k:k + oh.shape[1]].argmax(1).numpy() == y[test]).mean()))
        k += oh.shape[1]
    return accs


@pytest.mark.integration
def test_linear_probe_on_features_predicts_caption_attributes(default_toy):
    path = default_toy[0] / "runs" / "data" / "toy-v1"
    images = json.loads((path / "source" / "dataset_toy.json").read_text())["images"]
    with h5py.File(path / "features.h5", "r") as f:
        att = f["att"][:].astype(np.float32).reshape(len(images), -1)
        fc = f["fc"][:].astype(np.float32)
    split = np.array([im["split"] for im in images])
    train, test = np.flatnonzero(split == "train"), np.flatnonzero(split != "train")
    first = [im["shapes"][0] for im in images]  # the first shape in reading order
    targets = {
        "colour": (np.array([list(COLOURS).index(s["colour"]) for s in first]), 0.55),
        "kind": (np.array([KINDS.index(s["kind"]) for s in first]), 0.60),
        "count": (np.array([len(im["shapes"]) - 1 for im in images]), 0.60),
        "cell": (np.array([3 * s["row"] + s["col"] for s in first]), 0.70),
    }
    accs = _ridge_probe(att, [y for y, _ in targets.values()], train, test)
    for (name, (y, floor)), acc in zip(targets.items(), accs):
        majority = np.bincount(y[test]).max() / len(test)
        assert acc >= floor and acc > majority + 0.25, (name, acc, majority)
    # fc (no positions) still knows which colours are present: colour of the only shape of 1-shape images
    one = np.array([len(im["shapes"]) == 1 for im in images])
    y = targets["colour"][0]
    (acc,) = _ridge_probe(fc, [y], np.intersect1d(train, np.flatnonzero(one)),
                          np.intersect1d(test, np.flatnonzero(one)), lam=1.0)
    assert acc > 0.9, acc
