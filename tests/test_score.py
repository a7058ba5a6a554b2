"""`rdpp score` and `rdpp plot` end to end (typer's CliRunner on rdpp_cli.cli.app.app)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from rdpp_cli.artifacts import read_artifact, write_manifest
from rdpp_cli.metrics.cider import DocFreq
from rdpp_cli.scoring.plot import plot_scores

import cider_reference as ref
from helpers import error_line, rdpp

pytestmark = pytest.mark.integration


DATA = Path(__file__).parent / "data" / "coco-val2014-1k"
README = {"Bleu_1": 0.579400, "Bleu_2": 0.404391, "Bleu_3": 0.278536, "Bleu_4": 0.190829,
          "METEOR": 0.195255, "ROUGE_L": 0.396253, "CIDEr": 0.599791}
FAST = "Bleu_1,Bleu_4,ROUGE_L,CIDEr"  # no METEOR: its JVM takes seconds to start


# ----------------------------------------------------------------------------------------------
# the real data: coco-caption's demo results on 1,000 COCO val2014 images
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    # a comma-decimal JVM locale: METEOR would print "0,19" without the wrapper's locale flags
    env = {"JAVA_TOOL_OPTIONS": "-Duser.language=de -Duser.country=DE", "LC_ALL": "de_DE.UTF-8"}
    r = rdpp("score", DATA / "fakecap_results.json", "--refs", DATA / "captions_val2014_1k.json", "--oracle",
             "--diversity", "--workspace", ws, env=env)
    assert r.exit_code == 0, r.output
    return ws, r


def test_real_data_reproduces_the_coco_caption_numbers(real):
    ws, r = real
    art = read_artifact(ws / "scores" / "fakecap_results-v1", "rdpp.scores")
    s = json.loads((art.path / "scores.json").read_text())
    assert set(s) >= {"accuracy", "oracle", "diversity", "settings"}
    for metric, want in README.items():
        assert abs(s["accuracy"][metric] - want) < 1e-4, metric
    assert abs(s["accuracy"]["CIDEr"] - 0.599791) < 1e-6  # our CIDEr-D on the PTB-tokenized captions
    assert s["accuracy"]["SPICE"] is None and "SPICE" in s["settings"]["skipped"]
    # one caption per image: best of one is that caption's score
    per = pd.read_csv(art.path / "per_image.csv")
    assert len(per) == 1000 and (per["captions"] == 1).all()
    np.testing.assert_allclose(per["CIDEr_oracle"], per["CIDEr"])
    assert abs(per["CIDEr"].mean() - s["accuracy"]["CIDEr"]) < 1e-12
    assert s["oracle"]["CIDEr"] == pytest.approx(s["accuracy"]["CIDEr"], abs=1e-12)
    assert s["diversity"]["distinct"] == 1.0 and s["diversity"]["mbleu4"] is None
    assert s["settings"]["df_source"] is None  # no self-CIDEr asked for
    assert art.manifest["summary"]["CIDEr"] == pytest.approx(s["accuracy"]["CIDEr"])
    assert "METEOR" in r.output and "0.1953" in r.output  # the rich table


# ----------------------------------------------------------------------------------------------
# a tiny data artifact and samples artifact, written directly (docs/architecture.md)
# ----------------------------------------------------------------------------------------------

WORDS = ["a", "man", "rides", "horse", "dog", "runs", "on", "the", "beach", "red", "ball", "UNK"]
IMAGES = {  # image id -> (split, references)
    11: ("train", ["a man rides a horse", "a man on a horse", "the man rides the horse on the beach"]),
    12: ("train", ["a dog runs on the beach", "a red dog runs", "the dog runs"]),
    13: ("train", ["a red ball on the beach", "a ball", "the red ball"]),
    21: ("test", ["a man rides a red horse", "a man on the beach", "a horse on the beach"]),
    22: ("test", ["a dog runs to a ball", "the dog runs on the beach", "a red dog"]),
    23: ("val", ["a man", "a horse", "a dog"]),
}


def make_data(root: Path) -> Path:
    path = root / "data" / "tiny-v1"
    path.mkdir(parents=True)
    wid = {w: i + 1 for i, w in enumerate(WORDS)}
    rows, starts, ends, raws, L = [], [], [], [], 8
    for iid, (_, refs) in IMAGES.items():
        starts.append(len(rows))
        for c in refs:
            ids = [wid.get(w, wid["UNK"]) for w in c.split()][:L]
            rows.append(ids + [0] * (L - len(ids)))
            raws.append(c)
        ends.append(len(rows))
    labels = np.array(rows, np.int32)
    (path / "vocab.json").write_text(json.dumps({"words": WORDS}))
    with h5py.File(path / "captions.h5", "w") as f:
        f["labels"] = labels
        f["lengths"] = (labels != 0).sum(1).astype(np.int32)
        f["label_start"] = np.array(starts, np.int64)
        f["label_end"] = np.array(ends, np.int64)
        f["image_ids"] = np.array(list(IMAGES), np.int64)
        f["split"] = np.array([s.encode() for s, _ in IMAGES.values()], dtype="S5")
        f.create_dataset("raw", data=np.array(raws, dtype=object), dtype=h5py.string_dtype())
    with h5py.File(path / "features.h5", "w") as f:
        f["fc"] = np.zeros((len(IMAGES), 4), np.float16)
        f["att"] = np.zeros((len(IMAGES), 2, 4), np.float16)
        f["image_ids"] = np.array(list(IMAGES), np.int64)
    train = [labels[s:e] for s, e, (sp, _) in zip(starts, ends, IMAGES.values()) if sp == "train"]
    DocFreq.from_references(train).save_h5(path / "cider_df.h5")
    write_manifest(path, "rdpp.data", {"source": "test"})
    return path


SAMPLES = {  # test images, 3 captions each: one copies a training caption (not novel)
    21: ["a man rides a horse", "a man rides the horse on the beach", "a dog"],
    22: ["a dog runs on the beach", "a red ball", "a dog runs on the beach"],
}


def make_samples(root: Path, data: Path, captions: dict, name: str = "random-n3-v1") -> Path:
    path = root / "samples" / name
    path.mkdir(parents=True)
    (path / "samples.json").write_text(json.dumps(
        [{"image_id": i, "captions": c, "logprobs": [-1.0] * len(c)} for i, c in captions.items()]))
    write_manifest(path, "rdpp.samples", {"method": "random", "n": 3, "split": "test"},
                   inputs=[read_artifact(data, "rdpp.data")])
    return path


@pytest.fixture()
def ws(tmp_path):
    data = make_data(tmp_path)
    make_samples(tmp_path, data, SAMPLES)
    return tmp_path


def test_workspace_defaults_score_the_newest_samples_against_their_data(ws):
    r = rdpp("score", "--oracle", "--self-cider", "--diversity", "--metrics", FAST, "--workspace", ws)
    assert r.exit_code == 0, r.output
    art = read_artifact(ws / "scores" / "random-n3-v1", "rdpp.scores")
    assert {i["kind"] for i in art.inputs} == {"rdpp.samples", "rdpp.data"}
    assert art.config["split"] == "test" and art.config["self_cider_variant"] == "cider-d"
    s = json.loads((art.path / "scores.json").read_text())
    # independent numbers (pycocoevalcap's CiderScorer, df counted by hand): captions and references
    # are plain lower-case words, so PTB leaves them as they are
    refs = [IMAGES[i][1] for i in SAMPLES]
    caps = list(SAMPLES.values())
    df, ref_len = ref.corpus_df(refs)  # corpus mode: one document per scored image
    per = np.stack(ref.per_caption(caps, refs, df, ref_len))
    assert s["accuracy"]["CIDEr"] == pytest.approx(per.mean(), abs=1e-12)
    assert s["oracle"]["CIDEr"] == pytest.approx(per.max(1).mean(), abs=1e-12)
    assert per.max(1).mean() > per.mean() + 0.1  # the oracle is a different number here
    train_df, train_len = ref.corpus_df([r for sp, r in IMAGES.values() if sp == "train"])  # 3 training images
    sc = [ref.self_cider(c, train_df, train_len) for c in caps]
    assert s["diversity"]["self_cider"] == pytest.approx(np.mean(sc), abs=1e-9)
    assert 0.2 < sc[1] < sc[0]  # image 22 repeats a caption: less diverse than image 21
    assert s["diversity"]["novel"] == pytest.approx(3 / 6)  # "a man rides a horse", 2x "a dog runs on the beach" are not
    assert s["diversity"]["distinct"] == pytest.approx((3 + 2) / 2)
    assert s["diversity"]["vocab"] == 11  # a man rides horse the on beach dog runs red ball
    assert s["settings"]["df_source"].startswith("train (")
    assert s["human"]["images"] == 2 and 0 < s["human"]["self_cider"] <= 1
    assert s["oracle"].keys() == s["accuracy"].keys() and "METEOR" not in s["accuracy"]
    table = pd.read_csv(art.path / "per_image.csv")
    assert list(table["image_id"]) == [21, 22]
    np.testing.assert_allclose(table["CIDEr"], per.mean(1), atol=1e-12)
    np.testing.assert_allclose(table["CIDEr_oracle"], per.max(1), atol=1e-12)
    assert {"self_cider", "div1", "div2", "mbleu4", "distinct"} <= set(table.columns)
    assert art.manifest["summary"]["oracle_CIDEr"] == pytest.approx(per.max(1).mean())
    assert "oracle" in r.output and "CIDEr" in r.output  # the rich table
    # a second run writes a new version, never overwriting the first
    r2 = rdpp("score", "--metrics", "CIDEr", "--workspace", ws)
    assert r2.exit_code == 0, r2.output
    assert (ws / "scores" / "random-n3-v1-v2" / "manifest.json").is_file()  # the 2nd scores of random-n3-v1


def test_oracle_of_n_copies_equals_that_captions_score(ws, tmp_path):
    one = {21: ["a man rides the horse on the beach"], 22: ["a red dog runs"]}
    copies = {i: c * 4 for i, c in one.items()}
    f1, f4 = tmp_path / "one.json", tmp_path / "copies.json"
    f1.write_text(json.dumps([{"image_id": i, "captions": c} for i, c in one.items()]))
    f4.write_text(json.dumps([{"image_id": i, "captions": c} for i, c in copies.items()]))
    data = ws / "data" / "tiny-v1"
    for f in (f1, f4):
        r = rdpp("score", f, "--data", data, "--oracle", "--self-cider", "--metrics", FAST, "--workspace", ws)
        assert r.exit_code == 0, r.output
    s1 = json.loads((ws / "scores" / "one-v1" / "scores.json").read_text())
    s4 = json.loads((ws / "scores" / "copies-v1" / "scores.json").read_text())
    for m in ("CIDEr", "ROUGE_L", "Bleu_4"):
        assert s4["oracle"][m] == pytest.approx(s1["average"][m], abs=1e-12)
        assert s4["average"][m] == pytest.approx(s1["average"][m], abs=1e-12)
    assert s4["accuracy"]["CIDEr"] == pytest.approx(s1["accuracy"]["CIDEr"], abs=1e-12)
    assert s4["diversity"]["self_cider"] == 0.0
    assert s1["diversity"]["self_cider"] is None  # one caption per image has no self-CIDEr


def test_coco_results_form_and_refs_file(ws, tmp_path):
    res = tmp_path / "results.json"
    res.write_text(json.dumps([{"image_id": 21, "caption": "A man rides a horse."},
                               {"image_id": 22, "caption": "A dog runs!"},
                               {"image_id": 21, "caption": "A horse."}]))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"annotations": [{"image_id": i, "caption": c} for i, (_, cs) in IMAGES.items()
                                                for c in cs]}))
    r = rdpp("score", res, "--refs", refs, "--metrics", "CIDEr", "--out", tmp_path / "refused")
    assert r.exit_code == 2 and "entry 2 names image 21 again; pass --merge-duplicates" in error_line(r)
    assert not (tmp_path / "refused").exists()
    r = rdpp("score", res, "--refs", refs, "--self-cider", "--metrics", "CIDEr", "--out", tmp_path / "out",
             "--merge-duplicates")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert s["settings"]["captions_per_image"] == [1, 2]  # image 21 got two captions
    assert s["settings"]["df_source"].startswith("references")
    # corpus df: one document per scored image (21 and 22), whatever the captions per image
    df, ref_len = ref.corpus_df([IMAGES[21][1], IMAGES[22][1]])
    want = ref.cider_d([("a man rides a horse", IMAGES[21][1]), ("a horse", IMAGES[21][1]),
                        ("a dog runs", IMAGES[22][1])], df, ref_len).mean()
    assert s["accuracy"]["CIDEr"] == pytest.approx(want, abs=1e-12)


# ----------------------------------------------------------------------------------------------
# bad input: one clear line, exit 2, nothing written
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    ('[{"image_id": 21, "captions": ["a man"]}, {"image_id": 999, "captions": ["a dog"]}]',
     "image ids of .* are not in split 'test'"),
    ('[{"image_id": 21, "captions": []}]', "image 21 has an empty caption list"),
    ('[{"image_id": 21, "captions": ["a man"]', "is not valid JSON"),
    ('{"image_id": 21}', "must hold a non-empty JSON list"),
    ('[{"image_id": "x", "captions": ["a"]}]', "no integer image_id"),
    ('[{"image_id": "\u00b2", "captions": ["a"]}]', r"no integer image_id \(got '²'\)"),  # "²".isdigit()
    ('[{"image_id": 21, "caption": "a man"}, {"image_id": 21, "caption": "a dog"}]', "names image 21 again"),
    ('[{"image_id": 21, "captions": ["a man", "' + "big " * 20000 + '"]}]',
     "image 21 has a caption of 20,000 words .* over the 1,000 rdpp scores"),
    ('[{"image_id": 21, "captions": ["a"]}, {"image_id": 22, "caption": "b"}]', "mix 'captions' and 'caption'"),
])
def test_bad_input_is_one_line_and_writes_nothing(ws, tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    r = rdpp("score", bad, "--data", ws / "data" / "tiny-v1", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 2
    assert pytest.importorskip("re").search(message, error_line(r)), r.output
    assert not (ws / "scores").exists()


def test_other_bad_inputs(ws, tmp_path):
    r = rdpp("score", "--workspace", tmp_path / "empty")
    assert r.exit_code == 2 and "make one with `rdpp sample --n 20 --method random`" in error_line(r)
    r = rdpp("score", "--workspace", ws, "--metrics", "CIDEr,BLEU")
    assert r.exit_code == 2 and "unknown metric(s) BLEU" in error_line(r)
    r = rdpp("score", "--workspace", ws, "--split", "train", "--metrics", "CIDEr")
    assert r.exit_code == 2 and "not in split 'train'" in error_line(r)
    r = rdpp("score", "--workspace", ws, "--self-cider-variant", "bleu")
    assert r.exit_code == 2 and "--self-cider-variant" in error_line(r)
    r = rdpp("score", "--workspace", ws, "--refs", tmp_path / "nope.json")
    assert r.exit_code == 2 and "does not exist" in error_line(r)
    r = rdpp("score", "--workspace", ws, "--metrics", "CIDEr", env={"PATH": str(tmp_path), "RDPP_JAVA": ""})
    assert r.exit_code == 2 and "java not found" in error_line(r)
    assert not (ws / "scores").exists()


# ----------------------------------------------------------------------------------------------
# the diversity-accuracy plane
# ----------------------------------------------------------------------------------------------

def test_plot_of_several_scores_artifacts(ws, tmp_path):
    data = ws / "data" / "tiny-v1"
    make_samples(ws, data, {21: ["a man"] * 3, 22: ["a dog"] * 3}, name="greedy-n3-v1")
    r = rdpp("score", "random-n3-v1", "--plot", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    png = ws / "scores" / "random-n3-v1" / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = rdpp("score", "greedy-n3-v1", "--self-cider", "--metrics", "CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output
    r = rdpp("plot", "--workspace", ws, "--out", tmp_path / "fig.png")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    out = plot_scores([ws / "scores" / "random-n3-v1", ws / "scores" / "greedy-n3-v1"], tmp_path / "f2.png",
                      labels=["random", "greedy"])
    assert out.stat().st_size > 1000
    r = rdpp("plot", "--workspace", tmp_path / "nothing")
    assert r.exit_code == 2 and "no scores artifacts" in error_line(r)
