"""Vocabulary, encoding, captions.h5 and cider_df.h5 on a hand-computable Karpathy fixture.

tests/fixtures/karpathy_small.json (threshold 1, max length 4, restval joins train):
train words: a×4, cat×3, dog×2, ran×2, and every other word once -> vocab [a, cat, dog, ran, UNK]
(ids 1..5). Image 44's only sentence has no tokens, just raw text ("The cat ran!").
"""

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from rdpp_cli.data import vocab as V
from rdpp_cli.data.karpathy import load_karpathy, records_from_dataset, tokenize
from rdpp_cli.data.prepro import prepro_coco

FIXTURE = Path(__file__).parent / "fixtures" / "karpathy_small.json"


def make_images(root: Path, json_path: Path = FIXTURE) -> Path:
    """Tiny distinct PNGs for every image the caption file names."""
    for k, img in enumerate(json.loads(json_path.read_text())["images"]):
        p = root / img["filepath"] / img["filename"]
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (20 * k, 100, 200 - 20 * k)).save(p)
    return root


def run_fixture(tmp_path, **kw):
    images = make_images(tmp_path / "images")
    opts = dict(out=tmp_path / "art", word_count_threshold=1, max_length=4, backbone="pixstats", att_size=2,
                image_size=16, workers=0, batch_size=2)
    opts.update(kw)
    return prepro_coco(FIXTURE, images, **opts)


@pytest.mark.unit
def test_build_vocab_threshold_order_and_unk():
    caps = [["a", "cat", "sat"], ["a", "cat"], ["the", "dog"], ["a", "dog", "ran"], ["a", "cat", "ran"]]
    # counts: a 4, cat 3, dog 2, ran 2, sat 1, the 1
    assert V.build_vocab(caps, threshold=1) == ["a", "cat", "dog", "ran", "UNK"]
    assert V.build_vocab(caps, threshold=2) == ["a", "cat", "UNK"]
    assert V.build_vocab(caps, threshold=0) == ["a", "cat", "dog", "ran", "sat", "the", "UNK"]
    assert V.build_vocab(caps, threshold=4) == ["UNK"]


@pytest.mark.unit
def test_encode_maps_unknown_words_to_unk_and_clips():
    w2i = V.word_to_id(["a", "cat", "dog", "UNK"])
    assert w2i == {"a": 1, "cat": 2, "dog": 3, "UNK": 4}
    assert V.encode(["a", "zebra", "dog"], w2i, 16) == [1, 4, 3]
    assert V.encode(["a", "cat", "a", "dog", "a"], w2i, 3) == [1, 2, 1]
    labels, lengths = V.encode_all([["a", "cat", "a", "dog", "a"], ["dog"]], w2i, 3)
    assert labels.tolist() == [[1, 2, 1], [3, 0, 0]] and labels.dtype == np.int32
    assert lengths.tolist() == [3, 1]


@pytest.mark.unit
def test_tokenize_raw_like_karpathy():
    # Karpathy's split file splits at apostrophes and hyphens too ("bear's" -> "bear s")
    assert tokenize("A dog's bone, on the Table!") == ["a", "dog", "s", "bone", "on", "the", "table"]
    assert tokenize("2 T-shirts & 10 cats:\tupside-down.") == ["2", "t", "shirts", "10", "cats", "upside", "down"]


@pytest.mark.unit
def test_load_karpathy_restval_and_raw_fallback():
    recs = load_karpathy(FIXTURE)
    assert [(r.image_id, r.split) for r in recs] == [(11, "train"), (22, "train"), (33, "val"), (44, "test")]
    assert recs[0].relpath == "train2014/a.png"
    assert recs[3].captions == (("the", "cat", "ran"),)
    recs = load_karpathy(FIXTURE, restval_to_train=False)
    assert [r.image_id for r in recs] == [11, 33, 44]


@pytest.mark.integration
def test_captions_h5_matches_hand_encoding(tmp_path):
    art = run_fixture(tmp_path)
    assert json.loads((art.path / "vocab.json").read_text()) == {"words": ["a", "cat", "dog", "ran", "UNK"]}
    with h5py.File(art.path / "captions.h5", "r") as f:
        assert f["labels"].dtype == np.int32 and f["labels"].shape == (8, 4)
        assert f["labels"][:].tolist() == [
            [1, 2, 5, 0],  # a cat sat          (sat: UNK)
            [1, 2, 0, 0],  # a cat
            [5, 3, 0, 0],  # the dog            (the: UNK)
            [1, 3, 4, 5],  # a dog ran fast | and far away  (clipped to 4)
            [1, 2, 4, 0],  # a cat ran
            [1, 5, 0, 0],  # a zebra            (val word not in train: UNK)
            [1, 3, 5, 1],  # a dog and a | cat  (clipped)
            [5, 2, 4, 0],  # the cat ran        (tokenized from raw)
        ]
        assert f["lengths"][:].tolist() == [3, 2, 2, 4, 3, 2, 4, 3]
        assert f["label_start"][:].tolist() == [0, 3, 5, 7] and f["label_start"].dtype == np.int64
        assert f["label_end"][:].tolist() == [3, 5, 7, 8] and f["label_end"].dtype == np.int64
        assert f["image_ids"][:].tolist() == [11, 22, 33, 44]
        assert f["split"].dtype == np.dtype("S5")
        assert f["split"][:].tolist() == [b"train", b"train", b"val", b"test"]
        raw = [s.decode() for s in f["raw"][:]]
    # the sentences as written (scoring PTB-tokenizes them, as coco-caption does), not clipped or mapped
    assert raw[3] == "A dog ran fast, and far away." and raw[5] == "A zebra." and raw[7] == "The cat ran!"
    # UNK: 3 of the 14 training tokens, 6 of all 23; clipped: 2 of 8 captions are longer than 4 tokens
    assert art.manifest["summary"] == {"images": 4, "captions": 8, "vocab": 5, "train": 2, "val": 1, "test": 1,
                                       "word_count_threshold": 1, "unk_rate": round(6 / 23, 6),
                                       "unk_rate_train": round(3 / 14, 6), "clipped": 0.25}


@pytest.mark.integration
def test_cider_df_hand_counts(tmp_path):
    """Training images 11 and 22 (restval); the df counts each reference's ids *unclipped* plus the
    end token (id 6 = V + 1), as self-critical.pytorch's prepro_ngrams.py: 11 -> [1,2,5,6] [1,2,6]
    [5,3,6]; 22 -> [1,3,4,5,5,5,5,6] ("a dog ran fast and far away", not clipped to 4) [1,2,4,6].
    Each n-gram counted once per image."""
    art = run_fixture(tmp_path)
    expected = {
        (1,): 2, (2,): 2, (3,): 2, (4,): 1, (5,): 2, (6,): 2,
        (1, 2): 2, (2, 5): 1, (5, 6): 2, (2, 6): 1, (5, 3): 1, (3, 6): 1, (1, 3): 1, (3, 4): 1, (4, 5): 1,
        (5, 5): 1, (2, 4): 1, (4, 6): 1,
        (1, 2, 5): 1, (2, 5, 6): 1, (1, 2, 6): 1, (5, 3, 6): 1, (1, 3, 4): 1, (3, 4, 5): 1, (4, 5, 5): 1,
        (5, 5, 5): 1, (5, 5, 6): 1, (1, 2, 4): 1, (2, 4, 6): 1,
        (1, 2, 5, 6): 1, (1, 3, 4, 5): 1, (3, 4, 5, 5): 1, (4, 5, 5, 5): 1, (5, 5, 5, 5): 1, (5, 5, 5, 6): 1,
        (1, 2, 4, 6): 1,
    }
    with h5py.File(art.path / "cider_df.h5", "r") as f:
        assert f["ngrams"].dtype == np.int32 and f["ngrams"].shape == (36, 4)
        assert int(f.attrs["eos_id"]) == 6
        assert f["df"].dtype == np.float64
        assert int(f.attrs["num_docs"]) == 2
        got = {tuple(int(x) for x in g if x): float(d) for g, d in zip(f["ngrams"][:], f["df"][:])}
        # right-padded: zeros only after the ids
        assert all(list(g[g > 0]) + [0] * int((g == 0).sum()) == list(g) for g in f["ngrams"][:])
    assert got == expected


@pytest.mark.integration
def test_threshold_zero_and_no_restval(tmp_path):
    art = run_fixture(tmp_path / "t0", word_count_threshold=0)
    words = json.loads((art.path / "vocab.json").read_text())["words"]
    assert words == ["a", "cat", "dog", "ran", "and", "away", "far", "fast", "sat", "the", "UNK"]
    art = run_fixture(tmp_path / "nr", restval_to_train=False)
    assert json.loads((art.path / "vocab.json").read_text())["words"] == ["a", "cat", "UNK"]
    with h5py.File(art.path / "captions.h5", "r") as f:
        assert f["image_ids"][:].tolist() == [11, 33, 44]
    with h5py.File(art.path / "cider_df.h5", "r") as f:
        assert int(f.attrs["num_docs"]) == 1
    with h5py.File(art.path / "features.h5", "r") as f:
        assert f["image_ids"][:].tolist() == [11, 33, 44]


@pytest.mark.integration
def test_images_root_and_json_found_at_default_places(tmp_path, monkeypatch):
    root = tmp_path / "coco"
    make_images(root / "images")
    shutil.copy(FIXTURE, root / "dataset_coco.json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RDPP_COCO_ROOT", str(root))
    art = prepro_coco(workspace=tmp_path / "runs", word_count_threshold=1, backbone="pixstats", att_size=2,
                      image_size=16, workers=0)
    assert art.path == tmp_path / "runs" / "data" / "coco-v1"
    assert art.config["karpathy_json"] == str(root / "dataset_coco.json")
    assert art.config["images_root"] == str(root / "images")


@pytest.mark.integration
@pytest.mark.parametrize("threshold", [1, 2])
def test_every_caption_has_a_length_and_ids_within_vocab(tmp_path, threshold):
    art = run_fixture(tmp_path, word_count_threshold=threshold)
    n_words = len(json.loads((art.path / "vocab.json").read_text())["words"])
    with h5py.File(art.path / "captions.h5", "r") as f:
        labels, lengths = f["labels"][:], f["lengths"][:]
    assert (lengths >= 1).all() and labels.max() <= n_words
    for row, n in zip(labels, lengths):
        assert (row[:n] > 0).all() and (row[n:] == 0).all()


@pytest.mark.unit
def test_auto_threshold_is_the_references_on_coco_and_scales_down_to_one():
    assert V.auto_threshold(113_287) == 5  # Karpathy train + restval: the reference's count > 5
    assert V.auto_threshold(1_000_000) == 5
    assert [V.auto_threshold(n) for n in (56_643, 56_644, 33_986, 33_987)] == [2, 3, 1, 2]
    assert V.auto_threshold(312) == 1 and V.auto_threshold(0) == 1  # words seen once stay UNK


@pytest.mark.integration
def test_auto_threshold_on_the_fixture_and_a_bad_value(tmp_path):
    from rdpp_cli.errors import RdppError

    art = run_fixture(tmp_path / "auto", word_count_threshold="auto")
    assert art.config["word_count_threshold"] == "auto" and art.manifest["summary"]["word_count_threshold"] == 1
    assert json.loads((art.path / "vocab.json").read_text())["words"] == ["a", "cat", "dog", "ran", "UNK"]
    with pytest.raises(RdppError, match="neither a count nor 'auto'"):
        run_fixture(tmp_path / "bad", word_count_threshold="many")


@pytest.mark.unit
def test_tokenize_keeps_letters_of_every_script():
    """Letters outside ASCII are letters ("Mädchen", not "m dchen"); ASCII text is tokenized as before."""
    assert tokenize("Ein Mädchen, café-au-lait!") == ["ein", "mädchen", "café", "au", "lait"]
    assert tokenize("Ma\u0308dchen ＡＢＣ") == ["mädchen", "abc"]  # NFKC: composed, full-width folded
    assert tokenize("A dog\u2019s toy") == ["a", "dog", "s", "toy"]
    recs = records_from_dataset({"images": [{"filename": "a.jpg", "cocoid": 1, "split": "train",
                                             "sentences": [{"raw": "Zwei Mädchen spielen."}]}]}, "x.json")
    assert recs[0].captions == (("zwei", "mädchen", "spielen"),)
