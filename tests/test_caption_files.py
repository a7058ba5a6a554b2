"""`rdpp prepro coco --captions`: every caption-file format gives the data artifact that converting
it by hand into a Karpathy split JSON and running `--karpathy-json` gives (vocab.json and
captions.h5 byte for byte, cider_df.h5 and features.h5 array for array), keeps where its captions
came from, and refuses bad files in one line naming the file and the line, writing nothing."""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data.caption_files import detect, hash_split, ids_from_names
from rdpp_cli.data.karpathy import load_karpathy, records_from_dataset
from rdpp_cli.data.prepro import prepro_coco

REAL6 = Path(__file__).parent / "data" / "coco-real-6"
SHARED = Path(os.environ.get("RDPP_SHARED", Path(__file__).resolve().parents[2] / "shared"))
REAL390 = SHARED / "data" / "coco-real-390"
MOBILENET = SHARED / "weights" / "mobilenet_v2-imagenet-features.pth"

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

# Captions as written and the tokens Karpathy's split files give them, typed out by hand.
SENTENCES = [
    ("A man's  hat, blue-ish.", ["a", "man", "s", "hat", "blue", "ish"]),
    ("Two DOGS run on the beach", ["two", "dogs", "run", "on", "the", "beach"]),
    ("a red ball (on grass)!", ["a", "red", "ball", "on", "grass"]),
    ("The cat sits on a mat.", ["the", "cat", "sits", "on", "a", "mat"]),
    ("A dog with a red ball", ["a", "dog", "with", "a", "red", "ball"]),
    ("people walk in 2 rows", ["people", "walk", "in", "2", "rows"]),
]
SPLITS = ["train", "train", "train", "train", "train", "val", "test", "train"]


def caps(i: int, n: int = 3) -> list[tuple[str, list[str]]]:
    """Image i's n captions (raw, tokens)."""
    return [SENTENCES[(i + k) % len(SENTENCES)] for k in range(n)]


def photos(folder: Path, names: list[str]) -> None:
    rng = np.random.default_rng(len(names))
    folder.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        h, w = 20 + 3 * k, 50 - 2 * k
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / name)


def karpathy(images: list[dict], path: Path) -> Path:
    """The hand conversion: [{"rel", "id", "split", "caps": [(raw, tokens)]}] -> a Karpathy JSON."""
    data = {"images": [{"filepath": im["rel"].rpartition("/")[0], "filename": im["rel"].rpartition("/")[2], "cocoid": im["id"], "split": im["split"],
                        "sentences": [{"tokens": t, "raw": r} for r, t in im["caps"]]} for im in images]}
    path.write_text(json.dumps(data))
    return path


def build(tmp: Path, name: str, **kw):
    return prepro_coco(out=tmp / "out" / name, backbone="pixstats", att_size=4, image_size=32, batch_size=4, **kw)


def assert_same_artifact(a, b) -> None:
    """Same vocab.json and captions.h5 bytes; same cider_df.h5 and features.h5 arrays and attributes."""
    for name in ("vocab.json", "captions.h5"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name
    for name, keys in (("cider_df.h5", ("ngrams", "df")), ("features.h5", ("fc", "att", "image_ids"))):
        with h5py.File(a.path / name, "r") as fa, h5py.File(b.path / name, "r") as fb:
            for k in keys:
                assert fa[k].dtype == fb[k].dtype
                np.testing.assert_array_equal(fa[k][...], fb[k][...], err_msg=f"{name}:{k}")
            assert set(fa.attrs) == set(fb.attrs)
            assert all(np.array_equal(fa.attrs[k], fb.attrs[k]) for k in fa.attrs), name
    assert a.manifest["files"]["features.h5"]["sha256"] == b.manifest["files"]["features.h5"]["sha256"]
    assert a.manifest["summary"] == b.manifest["summary"]


def check_route(tmp: Path, hand: Path, hand_root: Path, captions: list[Path], images_root: Path | None = None,
                name: str = "captions", split_file: Path | None = None):
    """Both routes, compared; the --captions artifact's own record of its sources checked too."""
    want = build(tmp, "hand", karpathy_json=hand, images_root=hand_root)
    kw = {"karpathy_json": split_file}
    got = build(tmp, "captions", captions=captions, images_root=images_root, **kw)
    assert_same_artifact(want, got)
    derived = json.loads((got.path / "dataset.json").read_text())
    assert records_from_dataset(derived, "dataset.json") == load_karpathy(hand)
    assert "dataset.json" in got.manifest["files"] and not (want.path / "dataset.json").exists()
    listed = {Path(c["path"]).name: c for c in got.config["captions"]}
    for p in captions:
        assert listed[p.name]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert got.config["karpathy_json"] is None
    # the same files from a workspace: named by their format
    again = prepro_coco(captions=captions, images_root=images_root, workspace=tmp / "ws", backbone="pixstats",
                        att_size=4, image_size=32, **kw)
    assert again.path.name == f"{name}-v1"
    return got


def test_csv_with_a_header_in_any_column_order_paths_relative_to_the_file(tmp_path):
    names = [f"p{i}.png" for i in range(1, 9)]
    photos(tmp_path / "set" / "photos", names)
    rows = [(raw, f"photos/{n}", SPLITS[i], "x") for k in range(3) for i, n in enumerate(names)
            for raw, _ in [caps(i)[k]]]  # rows of an image are not adjacent
    with open(tmp_path / "set" / "mine.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Caption", "image", "split", "notes"])
        w.writerows(rows)
    assert detect(tmp_path / "set" / "mine.csv")[0] == "csv"
    hand = karpathy([{"rel": f"photos/{n}", "id": i + 1, "split": SPLITS[i], "caps": caps(i)}
                     for i, n in enumerate(names)], tmp_path / "hand.json")
    got = check_route(tmp_path, hand, tmp_path / "set", [tmp_path / "set" / "mine.csv"])
    assert Path(got.config["images_root"]).resolve() == (tmp_path / "set").resolve()


def test_csv_without_header_and_jsonl_with_ids_under_images_root(tmp_path):
    names = [f"img_{c}.png" for c in "abcdefgh"]  # no digits: ids 1..N in order of first appearance
    photos(tmp_path / "photos", names)
    order = [3, 0, 1, 2, 4, 5, 6, 7]
    lines = [f'{names[i]},"{raw}",{SPLITS[i]}' for i in order for raw, _ in caps(i, 2)]
    (tmp_path / "plain.csv").write_text("\n".join(lines) + "\n")
    hand = karpathy([{"rel": names[i], "id": k + 1, "split": SPLITS[i], "caps": caps(i, 2)}
                     for k, i in enumerate(order)], tmp_path / "hand.json")
    check_route(tmp_path / "a", hand, tmp_path / "photos", [tmp_path / "plain.csv"], tmp_path / "photos")

    jl = [json.dumps({"image": n, "caption": raw, "image_id": 500 - i, **({"split": SPLITS[i]} if i != 7 else {})})
          for i, n in enumerate(names) for raw, _ in caps(i)]
    (tmp_path / "mine.jsonl").write_text("\n".join(jl) + "\n")
    assert detect(tmp_path / "mine.jsonl")[0] == "jsonl"
    split7 = hash_split(names[7])  # no split given: the documented rule
    hand = karpathy([{"rel": n, "id": 500 - i, "split": SPLITS[i] if i != 7 else split7, "caps": caps(i)}
                     for i, n in enumerate(names)], tmp_path / "hand2.json")
    check_route(tmp_path / "b", hand, tmp_path / "photos", [tmp_path / "mine.jsonl"], tmp_path / "photos")


def coco_files(root: Path) -> tuple[list[dict], list[Path]]:
    """COCO's layout: annotations/captions_{train,val}2017.json beside train2017/ and val2017/."""
    ids = [139, 285, 632, 724, 776, 785, 802, 872]
    sets = ["train2017" if s == "train" else "val2017" for s in SPLITS]
    for s in ("train2017", "val2017"):
        photos(root / s, [f"{i:012d}.jpg" for i, ss in zip(ids, sets) if ss == s])
    (root / "annotations").mkdir()
    files = []
    for s in ("train2017", "val2017"):
        mine = [k for k, ss in enumerate(sets) if ss == s]
        anns = [{"id": 1000 * j + k, "image_id": ids[k], "caption": raw} for j in range(3) for k in mine
                for raw, _ in [caps(k)[j]]]
        data = {"info": {"description": "COCO 2017 Dataset"}, "licenses": [],
                "images": [{"id": ids[k], "file_name": f"{ids[k]:012d}.jpg", "height": 1, "width": 1} for k in mine],
                "annotations": anns}
        files.append(root / "annotations" / f"captions_{s}.json")
        files[-1].write_text(json.dumps(data))
    images = [{"rel": f"{sets[k]}/{ids[k]:012d}.jpg", "id": ids[k], "split": sets[k][:-4], "caps": caps(k)}
              for s in ("train2017", "val2017") for k, ss in enumerate(sets) if ss == s]
    return images, files


def test_coco_caption_files_split_by_their_names_images_found_beside_annotations(tmp_path):
    images, files = coco_files(tmp_path / "coco")
    assert [detect(f)[0] for f in files] == ["coco", "coco"]
    hand = karpathy(images, tmp_path / "hand.json")
    got = check_route(tmp_path, hand, tmp_path / "coco", files, name="coco")  # no --images-root
    assert Path(got.config["images_root"]).resolve() == (tmp_path / "coco").resolve()


def test_coco_caption_files_with_a_karpathy_split_file(tmp_path):
    images, files = coco_files(tmp_path / "coco")
    # the last image is not in the split file: left out
    split_of = {im["id"]: s for im, s in zip(images[:-1], ["train", "restval", "val", "test", "train", "test", "val"])}
    split_file = {"images": [{"filepath": "val2014", "filename": f"COCO_val2014_{i:012d}.jpg", "cocoid": i, "split": s,
                              "sentences": [{"tokens": ["unused"], "raw": "unused"}]} for i, s in split_of.items()]}
    (tmp_path / "dataset_coco.json").write_text(json.dumps(split_file))
    kept = [{**im, "split": split_of[im["id"]]} for im in images if im["id"] in split_of]
    hand = karpathy(kept, tmp_path / "hand.json")
    got = check_route(tmp_path, hand, tmp_path / "coco", files, tmp_path / "coco", name="coco",
                      split_file=tmp_path / "dataset_coco.json")
    assert [c["format"] for c in got.config["captions"]] == ["coco", "coco", "karpathy"]
    with h5py.File(got.path / "captions.h5", "r") as f:
        assert b"restval" not in set(f["split"][...])  # restval joined train


def test_flickr8k_token_file_with_its_split_lists(tmp_path):
    names = [f"{1000268201 + k}_693b08cb0{c}.jpg" for k, c in enumerate("abcdefgh")]
    photos(tmp_path / "Flicker8k_Dataset", names)
    text = tmp_path / "Flickr8k_text"
    text.mkdir()
    lines = [f"{n}#{j}\t{raw}" for i, n in enumerate(names) for j, (raw, _) in enumerate(caps(i, 5))]
    (text / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    lists = {"train": "trainImages", "val": "devImages", "test": "testImages"}
    for s, f in lists.items():  # the last image is in no list: left out
        (text / f"Flickr_8k.{f}.txt").write_text("".join(f"{n}\n" for i, n in enumerate(names[:-1]) if SPLITS[i] == s))
    assert detect(text / "Flickr8k.token.txt")[0] == "flickr"
    hand = karpathy([{"rel": n, "id": i + 1, "split": SPLITS[i], "caps": caps(i, 5)} for i, n in enumerate(names[:-1])],
                    tmp_path / "hand.json")
    got = check_route(tmp_path, hand, tmp_path / "Flicker8k_Dataset", [text / "Flickr8k.token.txt"], name="flickr")
    assert sorted(Path(c["path"]).name for c in got.config["captions"]) == [
        "Flickr8k.token.txt", "Flickr_8k.devImages.txt", "Flickr_8k.testImages.txt", "Flickr_8k.trainImages.txt"]


def test_flickr30k_token_file_splits_by_the_hash_rule(tmp_path):
    names = [f"{1000092795 + 7 * k}.jpg" for k in range(8)]
    photos(tmp_path / "flickr30k-images", names)
    lines = [f"{n}#{j}\t{raw}" for i, n in enumerate(names) for j, (raw, _) in enumerate(caps(i, 5))]
    (tmp_path / "results_20130124.token").write_text("\n".join(lines) + "\n")

    def rule(name):  # docs/data.md: sha256 of the file name, first 8 bytes big-endian, mod 10
        r = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 10
        return {0: "val", 1: "test"}.get(r, "train")

    hand = karpathy([{"rel": n, "id": int(n[:-4]), "split": rule(n), "caps": caps(i, 5)} for i, n in enumerate(names)],
                    tmp_path / "hand.json")
    check_route(tmp_path, hand, tmp_path / "flickr30k-images", [tmp_path / "results_20130124.token"], name="flickr")


def test_hash_split_is_the_documented_rule_and_about_80_10_10():
    got = [hash_split(f"{i}.jpg") for i in range(20000)]
    share = {s: got.count(s) / len(got) for s in ("train", "val", "test")}
    assert share["train"] == pytest.approx(0.8, abs=0.01) and share["val"] == pytest.approx(0.1, abs=0.01)
    assert hash_split("1000092795.jpg") == hash_split("1000092795.jpg")
    # literal values of sha256(name)[:8] % 10
    assert [hash_split(f"{c}.jpg") for c in "abcdefghij"] == [  # sha256(name)[:8] % 10 = 6 0 1 6 7 1 3 0 8 2
        "train", "val", "test", "train", "train", "test", "train", "val", "train", "train"]


def test_ids_from_names_is_rdpp_captions_rule():
    assert ids_from_names(["val2017/000000000139.jpg", "x/1000092795.jpg"]) == [139, 1000092795]
    assert ids_from_names(["1.jpg", "a/1.png"]) == [1, 2]  # not distinct
    assert ids_from_names(["1000268201_693b08cb0e.jpg", "7.jpg"]) == [1, 2]  # one has none


# ---- bad files: one line naming the file and the line, nothing written ----------------------------

def _csv(tmp: Path, text: str) -> list[str]:
    photos(tmp / "ph", ["a.png", "b.png"])
    (tmp / "bad.csv").write_text(text)
    return ["--captions", str(tmp / "bad.csv")]


def _coco(tmp: Path, images, anns) -> list[str]:
    photos(tmp / "ph", ["a.png", "b.png"])
    (tmp / "captions_train2017.json").write_text(json.dumps({"images": images, "annotations": anns}))
    return ["--captions", str(tmp / "captions_train2017.json"), "--images-root", str(tmp / "ph")]


def _flickr(tmp: Path, text: str) -> list[str]:
    photos(tmp / "ph", ["a.png", "b.png"])
    (tmp / "f.token").write_text(text)
    return ["--captions", str(tmp / "f.token"), "--images-root", str(tmp / "ph")]


A, B = {"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}
BAD = {
    "unknown format": (lambda t: (t / "x.txt").write_text("\nhello world\n") and ["--captions", str(t / "x.txt")],
                       "x.txt, line 2: unknown caption file format"),
    "caption row without image": (lambda t: _csv(t, "image,caption\nph/a.png,a cat\n,a dog\n"),
                                  "bad.csv, line 3: a caption with no image"),
    "image with an empty caption": (lambda t: _csv(t, "image,caption\nph/a.png,a cat\nph/b.png, ?! \n"),
                                    "bad.csv, line 3: image ph/b.png has an empty caption"),
    "image file missing": (lambda t: _csv(t, "image,caption\nph/a.png,a cat\n\nph/c.png,a dog\n"),
                           "bad.csv, line 4: image file"),
    "duplicate image id": (lambda t: _csv(t, "image,caption,image_id\nph/a.png,a cat,7\nph/b.png,a dog,7\n"),
                           "bad.csv, line 3: image id 7 of ph/b.png is also the id of ph/a.png"),
    "conflicting split": (lambda t: _csv(t, "image,caption,split\nph/a.png,a cat,train\nph/a.png,a dog,test\n"),
                          "bad.csv, line 3: image ph/a.png has split test here but train at"),
    "unknown split": (lambda t: _csv(t, "image,caption,split\nph/a.png,a cat,holdout\n"),
                      "bad.csv, line 2: split 'holdout'"),
    "unquoted commas": (lambda t: _csv(t, "image,caption\nph/a.png,a cat\nph/b.png,a, blue, triangle\n"),
                        "bad.csv, line 3 has 4 fields but the header has 2; quote a caption"),
    "unquoted commas, no header": (lambda t: _csv(t, "ph/a.png,a cat,train\nph/b.png,a, blue, triangle\n"),
                                   "bad.csv, line 2 has 4 fields but the image,caption,split form has 3"),
    "coco image without caption": (lambda t: _coco(t, [A, B], [{"image_id": 1, "caption": "a cat"}]),
                                   "captions_train2017.json, images[1]: image 2 (b.png) has no caption"),
    "coco caption without image": (lambda t: _coco(t, [A], [{"image_id": 1, "caption": "a"}, {"image_id": 9, "caption": "b"}]),
                                   "captions_train2017.json, annotations[1]: a caption of image 9"),
    "coco duplicate id": (lambda t: _coco(t, [A, {**B, "id": 1}], [{"image_id": 1, "caption": "a cat"}]),
                          "captions_train2017.json, images[1]: image id 1 appears twice"),
    "flickr duplicate caption id": (lambda t: _flickr(t, "a.png#0\ta cat\nb.png#0\ta dog\na.png#0\tthe cat\n"),
                                    "f.token, line 3: caption id a.png#0 appears twice (line 1 too)"),
    "flickr line without tab": (lambda t: _flickr(t, "a.png#0\ta cat\nb.png#0 a dog\n"),
                                "f.token, line 2 is not '<image>#<k><TAB><caption>'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_caption_files_are_one_line_naming_the_file_and_line(tmp_path, case):
    make, want = BAD[case]
    args = make(tmp_path)
    ws = tmp_path / "ws"
    r = CliRunner().invoke(app, ["prepro", "coco", *args, "--backbone", "pixstats", "--workspace", str(ws)],
                           env={"COLUMNS": "250", "RDPP_NO_PROGRESS": "1"})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], r.stderr
    assert not ws.exists()  # nothing written


def test_karpathy_json_given_as_captions_is_the_karpathy_route(tmp_path):
    got = build(tmp_path, "c", captions=[REAL6 / "dataset_coco6.json"], images_root=REAL6 / "images")
    want = build(tmp_path, "k", karpathy_json=REAL6 / "dataset_coco6.json", images_root=REAL6 / "images")
    assert_same_artifact(want, got)
    assert not (got.path / "dataset.json").exists()  # the source is already a Karpathy file: hashed, not copied
    assert got.config["karpathy_json"] == str(REAL6 / "dataset_coco6.json")
    assert got.config["captions"][0]["format"] == "karpathy"


# ---- real photos: the CSV a researcher writes, against the Karpathy route ----------------------------

def csv_of(karpathy_json: Path, out: Path) -> Path:
    """image,caption,split rows (one per caption) from a Karpathy split file's raw sentences."""
    data = json.loads(karpathy_json.read_text())
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "caption", "split"])
        for im in data["images"]:
            for s in im["sentences"]:
                w.writerow([f"{im['filepath']}/{im['filename']}", s["raw"], im["split"]])
    return out


def test_csv_of_the_six_real_photos_equals_the_karpathy_route(tmp_path):
    table = csv_of(REAL6 / "dataset_coco6.json", tmp_path / "real6.csv")
    want = build(tmp_path, "k", karpathy_json=REAL6 / "dataset_coco6.json", images_root=REAL6 / "images")
    got = build(tmp_path, "c", captions=[table], images_root=REAL6 / "images")
    assert_same_artifact(want, got)


@pytest.mark.slow  # ~65 s on 2 idle cores; the six real photos above check the same route in the default run
@pytest.mark.skipif(not (REAL390 / "dataset_coco390.json").is_file(),
                    reason=f"the 390 real COCO photos are not here ({REAL390}; set RDPP_SHARED)")
@pytest.mark.skipif(not MOBILENET.is_file(), reason=f"the MobileNetV2 weights are not here ({MOBILENET})")
def test_csv_of_the_390_real_photos_equals_the_karpathy_route(tmp_path):
    """The 390 photos with MobileNetV2 at 224 pixels, 7×7 (examples/real_photos.sh's settings)."""
    table = csv_of(REAL390 / "dataset_coco390.json", tmp_path / "real390.csv")
    kw = dict(images_root=REAL390 / "images", backbone="mobilenet_v2", weights=MOBILENET, image_size=224,
              att_size=7, device="cpu", workers=0)
    want = prepro_coco(REAL390 / "dataset_coco390.json", out=tmp_path / "k", **kw)
    got = prepro_coco(captions=[table], out=tmp_path / "c", **kw)
    assert_same_artifact(want, got)
    assert got.manifest["summary"]["images"] == 390
