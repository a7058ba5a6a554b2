"""Real photos through `rdpp prepro coco`: the six CC BY / BY-SA COCO photos of tests/data/coco-real-6,
and files made from them with Pillow the way they come from cameras and downloads (CMYK, an
EXIF-rotated phone photo, transparency, 16-bit, truncated). The 390-photo set and the MobileNetV2
weights of ../shared are used where they exist (CI) and skipped with the reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from rdpp_cli.cli.app import app
from rdpp_cli.data import features as F
from rdpp_cli.data.backbones import build_backbone
from rdpp_cli.data.karpathy import load_karpathy, tokenize
from rdpp_cli.data.prepro import prepro_coco
from rdpp_cli.errors import RdppError

from helpers import headless_mobilenet

REAL6 = Path(__file__).parent / "data" / "coco-real-6"
REAL6_JSON = REAL6 / "dataset_coco6.json"
GREY = REAL6 / "images" / "val2017" / "000000431848.jpg"
PORTRAIT = REAL6 / "images" / "val2017" / "000000290843.jpg"
LANDSCAPE = REAL6 / "images" / "val2017" / "000000002149.jpg"
SHARED = Path(os.environ.get("RDPP_SHARED", Path(__file__).resolve().parents[2] / "shared"))
REAL390 = SHARED / "data" / "coco-real-390"
MOBILENET = SHARED / "weights" / "mobilenet_v2-imagenet-features.pth"
need_390 = pytest.mark.skipif(not (REAL390 / "dataset_coco390.json").is_file(),
                              reason=f"the 390 real COCO photos are not here ({REAL390}; set RDPP_SHARED)")
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("one_thread")


def copy_set(root: Path) -> tuple[Path, Path]:
    """A writable copy of coco-real-6: (json, images root)."""
    shutil.copytree(REAL6 / "images", root / "images")
    shutil.copy(REAL6_JSON, root / "dataset.json")
    return root / "dataset.json", root / "images"


# ---- the photos as they are ------------------------------------------------------------------------

@pytest.mark.integration
def test_real_jpegs_make_a_data_artifact_with_headless_weights(tmp_path):
    weights = headless_mobilenet(tmp_path / "mnv2-features.pth")
    art = prepro_coco(REAL6_JSON, REAL6 / "images", tmp_path / "art", backbone="mobilenet_v2", weights=weights,
                      image_size=64, att_size=2, batch_size=4, workers=0)
    art.verify()
    cfg = art.config
    # accepted although it lacks the head, and the manifest says which keys were missing
    assert cfg["weights_missing_head"] == ["classifier.1.weight", "classifier.1.bias"]
    assert len(cfg["weights_sha256"]) == 64 and cfg["word_count_threshold"] == "auto"
    data = json.loads(REAL6_JSON.read_text())["images"]
    with h5py.File(art.path / "features.h5", "r") as f:
        fc, att = f["fc"][:].astype(np.float32), f["att"][:].astype(np.float32)
        assert f["image_ids"][:].tolist() == [im["cocoid"] for im in data]
    assert fc.shape == (6, 1280) and att.shape == (6, 4, 1280) and np.isfinite(att).all()
    assert len({row.tobytes() for row in fc}) == 6  # the greyscale and the panorama photo too
    with h5py.File(art.path / "captions.h5", "r") as f:
        raw = [s.decode() for s in f["raw"][:]]
    # the references are the sentences as written (capitals and punctuation), for the PTB tokenizer
    assert raw == [" ".join(s["raw"].split()) for im in data for s in im["sentences"]]
    assert "A BOY WITH A BLUE SHIRT AND JEAN PANTS DOING A TRICK WITH HIS SKATEBOARD" in raw
    s = art.manifest["summary"]
    assert s["word_count_threshold"] == 1 and s["vocab"] > 1 and 0 < s["unk_rate_train"] < s["unk_rate"] < 1
    assert 0 <= s["clipped"] < 1


@pytest.mark.integration
def test_weights_missing_a_trunk_key_are_refused_before_writing(tmp_path):
    state = torch.load(headless_mobilenet(tmp_path / "w.pth"), weights_only=True)
    del state["features.3.conv.1.0.weight"]
    torch.save(state, tmp_path / "cut.pth")
    with pytest.raises(RdppError, match=r"do not fit mobilenet_v2 \(missing keys such as features\.3\.conv\.1\.0\.weight"):
        prepro_coco(REAL6_JSON, REAL6 / "images", tmp_path / "art", backbone="mobilenet_v2",
                    weights=tmp_path / "cut.pth", image_size=64, att_size=2, workers=0)
    assert not (tmp_path / "art").exists()


@pytest.mark.unit
def test_karpathy_tokens_are_the_raw_sentences_tokenized():
    """Karpathy's tokens split at apostrophes and hyphens; a caption given only as raw text must be
    tokenized the same way."""
    for im in json.loads(REAL6_JSON.read_text())["images"]:
        for s in im["sentences"]:
            assert tokenize(s["raw"]) == s["tokens"], s["raw"]


@pytest.mark.unit
@need_390
def test_karpathy_tokens_are_the_raw_sentences_tokenized_on_all_390_photos():
    data = json.loads((REAL390 / "dataset_coco390.json").read_text())
    sents = [s for im in data["images"] for s in im["sentences"]]
    assert len(sents) == 1951
    assert sum("'" in s["raw"] for s in sents) > 10  # "bear's", "it's": the cases that once differed
    assert [tokenize(s["raw"]) for s in sents] == [s["tokens"] for s in sents]


@pytest.mark.integration
def test_default_workers_fit_the_cores_and_torch_does_not_warn(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert F.default_workers("cuda") == 1
    assert F.default_workers("cpu") == 0  # the CNN's threads take both cores; a decoder would slow it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        art = prepro_coco(REAL6_JSON, REAL6 / "images", tmp_path / "art", backbone="pixstats", att_size=2,
                          image_size=16, batch_size=3, device="cpu")
    assert art.config["workers"] == 0
    assert not [w for w in caught if "worker" in str(w.message)], [str(w.message) for w in caught]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert (F.default_workers("cuda"), F.default_workers("cuda:1"), F.default_workers("cpu")) == (7, 7, 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert (F.default_workers("cuda"), F.default_workers("cpu")) == (0, 0)


@pytest.mark.unit
def test_cpu_extraction_feeds_a_cnn_one_channels_last_image_at_a_time_with_the_same_features():
    """On a CPU a CNN's activations for one image fit the caches and a batch's do not (MobileNetV2 at
    448 px: ~18 ms an image one at a time in channels-last, 60-110 ms in batches of 8;
    benchmarks/prepro.py). The chunked forward must give the batched forward's numbers."""
    paths = [GREY, PORTRAIT, LANDSCAPE] * 2
    bb = build_backbone("resnet18", att_size=2, image_size=64, pretrained=False)
    assert bb.cpu_chunk == 1
    seen = []
    hook = bb.module.trunk.register_forward_pre_hook(
        lambda mod, args: seen.append((args[0].shape[0], args[0].is_contiguous(memory_format=torch.channels_last))))
    try:
        out = list(F.iter_features(paths, bb, batch_size=4, device="cpu"))
    finally:
        hook.remove()
    assert seen == [(1, True)] * 6
    fc, att = np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])
    x = torch.stack([F.ImageFiles(paths, 64, bb.mean, bb.std)[i][0] for i in range(6)])
    with torch.inference_mode():
        ref_fc, ref_att = bb.module.to(memory_format=torch.contiguous_format)(x.contiguous())
    assert fc.shape == (6, 512) and att.shape == (6, 4, 512)
    np.testing.assert_allclose(fc, ref_fc.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(att, ref_att.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fc[:3], fc[3:], rtol=0, atol=0)  # the same photo, the same numbers

    pix = build_backbone("pixstats", att_size=2, image_size=16)
    assert pix.cpu_chunk is None  # tiny ops: the whole batch in one call


# ---- files as cameras and downloads make them --------------------------------------------------------

def _read(path: Path, size: int = 96) -> np.ndarray:
    """The photo as the extraction loop's dataset gives it (before normalisation)."""
    x, _, err = F.ImageFiles([path], size)[0]
    assert err == "", err
    return x.numpy()


def _jpeg(im: Image.Image, path: Path, **kw) -> Path:
    im.save(path, format="JPEG", quality=95, **kw)
    return path


@pytest.mark.unit
def test_exif_rotated_phone_photo_is_read_upright(tmp_path):
    """A phone stores the pixels sideways and EXIF orientation 6 ("rotate 90° clockwise to view")."""
    upright = Image.open(PORTRAIT).convert("RGB")
    want = _read(_jpeg(upright, tmp_path / "upright.jpg"))
    exif = Image.Exif()
    exif[0x0112] = 6
    sideways = _jpeg(upright.transpose(Image.Transpose.ROTATE_90), tmp_path / "phone.jpg", exif=exif.tobytes())
    assert Image.open(sideways).size == (640, 428)  # stored landscape
    got = _read(sideways)
    assert np.abs(got - want).mean() < 0.01  # only the JPEG re-encoding differs
    # read without its orientation, the photo is another picture altogether
    stored = np.asarray(Image.open(sideways).convert("RGB").resize((96, 96), Image.BILINEAR), np.float32) / 255
    assert np.abs(stored.transpose(2, 0, 1) - want).mean() > 0.05


@pytest.mark.unit
def test_greyscale_cmyk_and_other_modes_become_the_same_rgb(tmp_path):
    rgb = Image.open(LANDSCAPE).convert("RGB")
    want = _read(_jpeg(rgb, tmp_path / "rgb.jpg"))
    cmyk = _jpeg(rgb.convert("CMYK"), tmp_path / "cmyk.jpg")
    assert Image.open(cmyk).mode == "CMYK"
    assert np.abs(_read(cmyk) - want).mean() < 0.02
    # the real greyscale photo: three equal channels
    grey = _read(GREY)
    assert Image.open(GREY).mode == "L" and grey.shape == (3, 96, 96)
    assert np.array_equal(grey[0], grey[1]) and np.array_equal(grey[1], grey[2])
    # 16-bit greyscale PNG: scaled to 8 bits, not clipped to white
    g8 = np.asarray(Image.open(GREY).resize((96, 96), Image.BILINEAR), np.float32) / 255
    Image.fromarray((np.asarray(Image.open(GREY), np.uint16) * 257).astype(np.uint16)).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode.startswith("I")
    assert np.abs(_read(tmp_path / "g16.png")[0] - g8).max() < 2 / 255
    # transparency is composited onto white (not onto whatever the hidden colour values are)
    rgba = rgb.convert("RGBA")
    rgba.putalpha(0)
    rgba.save(tmp_path / "clear.png")
    assert (_read(tmp_path / "clear.png") == 1.0).all()
    pal = rgb.convert("P")
    pal.info["transparency"] = 0
    pal.save(tmp_path / "pal.png", transparency=0)
    assert _read(tmp_path / "pal.png").shape == (3, 96, 96)


@pytest.mark.unit
def test_any_size_and_aspect_ratio(tmp_path):
    src = Image.open(LANDSCAPE).convert("RGB")
    for w, h in ((1, 1), (3, 500), (2000, 7), (33, 31)):
        p = _jpeg(src.resize((w, h)), tmp_path / f"{w}x{h}.jpg")
        x = _read(p, 64)
        assert x.shape == (3, 64, 64) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
def test_broken_photo_is_one_line_naming_it_and_nothing_is_written(tmp_path, damage):
    js, images = copy_set(tmp_path)
    bad = images / "val2017" / "000000161044.jpg"
    data = bad.read_bytes()
    bad.write_bytes({"truncated": data[:len(data) // 2], "empty": b"", "text": b"<html>404</html>"}[damage])
    ws = tmp_path / "runs"
    r = runner.invoke(app, ["prepro", "coco", "--karpathy-json", str(js), "--images-root", str(images),
                            "--workspace", str(ws), "--backbone", "pixstats", "--att-size", "2",
                            "--image-size", "16", "--workers", "0"], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(bad) in lines[0], r.stderr
    assert ("truncated or damaged" if damage == "truncated" else "is not an image") in lines[0]
    assert not ws.exists() or not any(p.is_file() for p in ws.rglob("*"))


@pytest.mark.unit
def test_a_jpeg_with_bytes_after_its_end_marker_is_fine(tmp_path):
    """Some cameras append data after the JPEG's end: not mistaken for a truncated file."""
    p = tmp_path / "tail.jpg"
    p.write_bytes(LANDSCAPE.read_bytes() + b"\x00" * 10 + b"SEFHcamera-trailer" * 8)
    assert F.image_problem(p) is None
    assert np.array_equal(_read(p), _read(LANDSCAPE))


# ---- the 390 photos and the real ImageNet trunk (CI) ---------------------------------------------------

@pytest.mark.unit
@need_390
@pytest.mark.skipif(not MOBILENET.is_file(), reason=f"MobileNetV2 ImageNet trunk not here ({MOBILENET})")
def test_imagenet_trunk_on_real_photos_gives_distinct_informative_features(tmp_path):
    """../shared's head-less ImageNet MobileNetV2 is accepted, and its features of real photos are
    not those of a random network: photos of the same kind are closer than photos of different kinds."""
    recs = {r.image_id: r for r in load_karpathy(REAL390 / "dataset_coco390.json")}
    bb = build_backbone("mobilenet_v2", att_size=1, image_size=224, weights=MOBILENET)
    assert bb.missing_head == ["classifier.1.weight", "classifier.1.bias"]
    # two elephant photos and two pizza photos: every caption of each says so
    def with_word(word):
        return [i for i, r in recs.items() if all(word in c for c in r.captions)][:2]
    elephants, pizzas = with_word("elephant"), with_word("pizza")
    assert len(elephants) == 2 and len(pizzas) == 2
    paths = [REAL390 / "images" / recs[i].relpath for i in elephants + pizzas]
    fc = np.concatenate([f for f, _ in F.iter_features(paths, bb, batch_size=4, workers=0)])
    fc = fc / np.linalg.norm(fc, axis=1, keepdims=True)
    sim = fc @ fc.T
    assert sim[0, 1] > max(sim[0, 2:].max(), sim[1, 2:].max())
    assert sim[2, 3] > max(sim[2, :2].max(), sim[3, :2].max())


@pytest.mark.integration
def test_rdpp_ls_shows_the_vocabulary_unk_rate_and_clipping(tmp_path):
    ws = tmp_path / "runs"
    prepro_coco(REAL6_JSON, REAL6 / "images", workspace=ws, backbone="pixstats", att_size=2, image_size=16,
                workers=0, max_length=8)
    r = runner.invoke(app, ["ls", "--workspace", str(ws)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.output.splitlines() if "coco-v1" in ln)
    for field in ("vocab=", "word_count_threshold=1", "unk_rate=", "unk_rate_train=", "clipped="):
        assert field in row, row


@pytest.mark.integration
def test_a_relative_weights_path_is_recorded_so_caption_finds_it_from_any_folder(tmp_path, monkeypatch):
    """`rdpp prepro coco --weights ../shared/weights/x.pth` then `rdpp caption` from another folder."""
    from rdpp_cli.captioning.caption import backbone_of

    (tmp_path / "here").mkdir()
    headless_mobilenet(tmp_path / "w.pth")
    monkeypatch.chdir(tmp_path / "here")
    art = prepro_coco(REAL6_JSON, REAL6 / "images", tmp_path / "art", backbone="mobilenet_v2",
                      weights=Path("../w.pth"), image_size=64, att_size=2, workers=0)
    assert art.config["weights"] == str((tmp_path / "w.pth").resolve())
    monkeypatch.chdir(tmp_path / "art")
    bb, dtype = backbone_of(art)
    assert bb.weights_sha256 == art.config["weights_sha256"] and dtype == "float16"
