"""`rdpp caption` on the real photos of tests/data/coco-real-6, and UNK suppression in `rdpp sample`
and in validation (self-critical.pytorch's evaluation default)."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch

from rdpp_cli.artifacts import finish, prepare_output, read_artifact, write_manifest
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.prepro import prepro_coco
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.data.vocab import unk_id
from rdpp_cli.models.registry import build
from rdpp_cli.models.checkpoint import save_checkpoint
from rdpp_cli.training.xe import train_xe

from helpers import headless_mobilenet, rdpp

REAL6 = Path(__file__).parent / "data" / "coco-real-6"
PHOTOS = REAL6 / "images" / "val2017"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A data artifact of the six real photos (a random-init MobileNetV2 saved without its head, as a
    user's weights file) and a briefly XE-trained model on it, in one workspace."""
    root = tmp_path_factory.mktemp("real")
    weights = headless_mobilenet(root / "mnv2.pth")
    ws = root / "runs"
    data = prepro_coco(REAL6 / "dataset_coco6.json", REAL6 / "images", workspace=ws, backbone="mobilenet_v2",
                       weights=weights, image_size=64, att_size=2, batch_size=4, workers=0)
    model = train_xe(workspace=ws, preset="small", epochs=10, batch_size=4, lr=5e-3, device="cpu")
    return ws, data, model, weights


class _Sheet(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_data(self, data):
        self.text.append(data)


@pytest.mark.integration
def test_caption_folder_writes_results_and_a_self_contained_contact_sheet(real):
    ws, data, model, _ = real
    r = rdpp("caption", PHOTOS, "--workspace", ws, "--device", "cpu")
    assert r.exit_code == 0, r.output
    art = read_artifact(ws / "captions" / f"{model.name}.beam-b3-n1-v1", "rdpp.captions")
    assert [i["manifest_sha256"] for i in art.inputs] == [model.manifest_sha256, data.manifest_sha256]
    results = json.loads((art.path / "results.json").read_text())
    files = sorted(PHOTOS.glob("*.jpg"))
    # one entry per photo, coco-caption's results form, ids from the COCO file names
    assert [e["image_id"] for e in results] == [int(f.stem) for f in files]
    assert [Path(e["file"]).name for e in results] == [f.name for f in files]
    for e in results:
        assert isinstance(e["caption"], str) and e["captions"] == [e["caption"]]
        assert "UNK" not in e["caption"].split()
    page = (art.path / "contact_sheet.html").read_text()
    sheet = _Sheet()
    sheet.feed(page)
    text = " ".join(sheet.text)
    assert len(sheet.imgs) == 6 and all(i["src"].startswith("data:image/jpeg;base64,") for i in sheet.imgs)
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    for f, e in zip(files, results):
        assert f.name in text and e["caption"] in text
    # rdpp score reads the results file against COCO's annotations of these photos
    r = rdpp("score", art.path / "results.json", "--refs", REAL6 / "captions_val2017_6.json",
             "--metrics", "Bleu_1,CIDEr", "--workspace", ws)
    assert r.exit_code == 0, r.output


@pytest.mark.integration
@pytest.mark.parametrize("method,n", [("beam", 2), ("random", 3)])
def test_captioning_the_val_photos_gives_rdpp_samples_captions(real, tmp_path, method, n):
    ws, data, model, _ = real
    ds = DataArtifact(data)
    val = [PHOTOS / f"{int(i):012d}.jpg" for i in ds.image_ids[ds.split_indices("val")]]
    r = rdpp("sample", model.path, "--split", "val", "--method", method, "--n", n, "--device", "cpu",
             "--out", tmp_path / "s", "--workspace", ws)
    assert r.exit_code == 0, r.output
    r = rdpp("caption", *val, "--from", model.path, "--method", method, "--n", n, "--device", "cpu",
             "--out", tmp_path / "c", "--workspace", ws)
    assert r.exit_code == 0, r.output
    sampled = json.loads((tmp_path / "s" / "samples.json").read_text())
    captioned = json.loads((tmp_path / "c" / "results.json").read_text())
    assert [e["image_id"] for e in captioned] == [e["image_id"] for e in sampled]
    assert [e["captions"] for e in captioned] == [e["captions"] for e in sampled]
    np.testing.assert_allclose([e["logprobs"] for e in captioned], [e["logprobs"] for e in sampled], atol=1e-4)


@pytest.mark.integration
def test_captioning_with_a_model_that_reads_fc_gives_rdpp_samples_captions(real, tmp_path):
    """UpDown reads the pooled fc features too: `rdpp caption` extracts them beside the att grid and
    passes both, so its captions of the val photos are `rdpp sample`'s of the stored features."""
    ws, data, _, _ = real
    model = train_xe(data.path, workspace=ws, model="updown", preset="small", epochs=3, batch_size=4, lr=5e-3,
                     device="cpu", out=tmp_path / "updown")
    ds = DataArtifact(data)
    val = [PHOTOS / f"{int(i):012d}.jpg" for i in ds.image_ids[ds.split_indices("val")]]
    common = ["--method", "random", "--n", "3", "--device", "cpu", "--workspace", ws]
    assert rdpp("sample", model.path, "--split", "val", "--out", tmp_path / "s", *common).exit_code == 0
    r = rdpp("caption", *val, "--from", model.path, "--out", tmp_path / "c", *common)
    assert r.exit_code == 0, r.output
    sampled = json.loads((tmp_path / "s" / "samples.json").read_text())
    captioned = json.loads((tmp_path / "c" / "results.json").read_text())
    assert [e["captions"] for e in captioned] == [e["captions"] for e in sampled]
    np.testing.assert_allclose([e["logprobs"] for e in captioned], [e["logprobs"] for e in sampled], atol=1e-4)


@pytest.mark.integration
def test_caption_bad_input_is_one_line(real, tmp_path):
    ws, data, model, weights = real
    r = rdpp("caption", tmp_path / "nope.jpg", "--workspace", ws)
    assert r.exit_code == 2 and "nope.jpg does not exist" in r.stderr
    (tmp_path / "empty").mkdir()
    r = rdpp("caption", tmp_path / "empty", "--workspace", ws)
    assert r.exit_code == 2 and "no image files" in r.stderr
    bad = tmp_path / "cut.jpg"
    bad.write_bytes((PHOTOS / "000000002149.jpg").read_bytes()[:5000])
    r = rdpp("caption", bad, "--workspace", ws)
    assert r.exit_code == 2 and "cut.jpg cannot be decoded" in r.stderr
    # the backbone's weights file moved: one line naming it; --weights points to it again
    moved = tmp_path / "moved.pth"
    shutil.move(weights, moved)
    try:
        r = rdpp("caption", PHOTOS, "--workspace", ws, "--out", tmp_path / "x")
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.exit_code == 2 and len(lines) == 1 and f"weights file {weights} (recorded in" in lines[0], r.stderr
        assert not (tmp_path / "x").exists()
        other = tmp_path / "other.pth"
        torch.save(torch.load(moved, weights_only=True) | {"features.0.0.weight": torch.zeros(32, 3, 3, 3)}, other)
        r = rdpp("caption", PHOTOS, "--workspace", ws, "--weights", other, "--out", tmp_path / "x")
        assert r.exit_code == 2 and "is not the one data artifact" in r.stderr
        r = rdpp("caption", PHOTOS, "--workspace", ws, "--weights", moved, "--out", tmp_path / "x")
        assert r.exit_code == 0, r.output
    finally:
        shutil.move(moved, weights)


# ---- photos of every size, colour mode and format --------------------------------------------------

SAVE = {"JPEG": "jpg", "PNG": "png", "GIF": "gif", "WEBP": "webp"}


def photo_zoo(folder: Path) -> list[tuple[Path, str, tuple[int, int]]]:
    """A real photo saved smaller (160×120) and larger (640×480) than the contact sheet's 256-pixel
    thumbnail, in RGB, L, P, CMYK and RGBA, as JPEG, PNG, GIF and WebP (every pair Pillow writes):
    (file, mode it reads back as, size)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    with Image.open(PHOTOS / "000000002149.jpg") as src:
        src = src.convert("RGB")
        for size in ((160, 120), (640, 480)):
            base = src.resize(size)
            for mode in ("RGB", "L", "P", "CMYK", "RGBA"):
                im = base.convert(mode)
                if mode == "RGBA":  # a transparent corner
                    im.putalpha(Image.linear_gradient("L").resize(size))
                for fmt, ext in SAVE.items():
                    f = folder / f"{mode.lower()}_{size[0]}.{ext}"
                    try:
                        im.save(f, format=fmt)
                    except (OSError, ValueError):  # e.g. P as JPEG, CMYK as PNG: not writable
                        continue
                    with Image.open(f) as back:
                        out.append((f, back.mode, size))
    return out


@pytest.mark.integration
def test_contact_sheet_shows_photos_of_every_size_mode_and_format(tmp_path):
    """Each thumbnail is the photo upright in RGB within 256×256, aspect kept: photos no larger than
    the thumbnail keep their size (an RGB JPEG among them used to be returned unread from a closed file)."""
    import base64
    import io

    from PIL import Image

    from rdpp_cli.captioning.contact_sheet import SheetEntry, render_html
    from rdpp_cli.data.features import to_rgb

    zoo = photo_zoo(tmp_path / "zoo")
    assert {m for _, m, _ in zoo} >= {"RGB", "L", "P", "CMYK", "RGBA"}
    assert {f.suffix for f, _, _ in zoo} == {".jpg", ".png", ".gif", ".webp"}
    page = render_html([SheetEntry(f, k, [f"caption {k}"]) for k, (f, _, _) in enumerate(zoo)], title="zoo")
    sheet = _Sheet()
    sheet.feed(page)
    assert len(sheet.imgs) == len(zoo)
    for (f, mode, size), img in zip(zoo, sheet.imgs):
        data = base64.b64decode(img["src"].removeprefix("data:image/jpeg;base64,"))
        thumb = Image.open(io.BytesIO(data))
        assert thumb.format == "JPEG" and thumb.mode == "RGB"
        want = size if max(size) <= 256 else (256, 192)
        assert thumb.size == want, (f.name, thumb.size)

        def coarse(x):  # 16×12 block means: the picture, without JPEG's and dithering's pixel noise
            return np.asarray(x.resize((16, 12), Image.BOX), dtype=np.float64)
        with Image.open(f) as im:
            ref = coarse(to_rgb(im))
        assert np.abs(coarse(thumb) - ref).mean() < 4, (f.name, mode)


@pytest.mark.integration
def test_caption_photos_of_every_size_mode_and_format(real, tmp_path):
    ws, data, model, _ = real
    zoo = photo_zoo(tmp_path / "zoo")
    r = rdpp("caption", tmp_path / "zoo", "--workspace", ws, "--device", "cpu", "--out", tmp_path / "c")
    assert r.exit_code == 0, r.output
    results = json.loads((tmp_path / "c" / "results.json").read_text())
    assert sorted(Path(e["file"]).name for e in results) == sorted(f.name for f, _, _ in zoo)
    assert all(isinstance(e["caption"], str) and len(e["captions"]) == 1 for e in results)
    sheet = _Sheet()
    sheet.feed((tmp_path / "c" / "contact_sheet.html").read_text())
    assert len(sheet.imgs) == len(zoo)


# ---- UNK suppression ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unk_lover(tmp_path_factory):
    """A toy data artifact and a model whose favourite word everywhere is UNK."""
    ws = tmp_path_factory.mktemp("unk")
    data = prepro_toy(workspace=ws, images=60, seed=1)
    ds = DataArtifact(data)
    torch.manual_seed(0)
    net = build("att2in", "small", vocab_size=ds.vocab_size, att_feat_size=ds.att_dim, seq_length=ds.seq_length,
                rnn_size=32, input_encoding_size=32, att_hid_size=32)
    with torch.no_grad():
        net.logit.bias[unk_id(ds.words)] += 8.0
    out = prepare_output(None, workspace=ws, group="xe", name="unk", kind="rdpp.model", config={"stage": "xe"})
    save_checkpoint(out / "checkpoints" / "best.pt", net, ds.words)
    model = write_manifest(out, "rdpp.model", {"stage": "xe"}, inputs=[data])
    finish(out)
    return ws, ds, net, model


@pytest.mark.integration
@pytest.mark.parametrize("method", ["greedy", "beam", "random", "topk", "nucleus", "dbs"])
def test_rdpp_sample_never_says_unk_unless_allowed(unk_lover, tmp_path, method):
    ws, ds, _, model = unk_lover
    args = ["sample", model.path, "--method", method, "--n", "2", "--top-k", "3", "--top-p", "0.9",
            "--groups", "2", "--device", "cpu", "--workspace", ws, "--max-images", "4"]

    def words(out):
        r = rdpp(*args, "--out", tmp_path / out, *([] if out == "default" else ["--allow-unk"]))
        assert r.exit_code == 0, r.output
        recs = json.loads((tmp_path / out / "samples.json").read_text())
        return [w for rec in recs for c in rec["captions"] for w in c.split()]

    assert "UNK" not in words("default") and "UNK" in words("allowed")


@pytest.mark.integration
def test_validation_decoding_never_says_unk(unk_lover, monkeypatch):
    """The greedy captions scored after every epoch: a spy on the decoder sees no UNK come out."""
    import importlib

    from rdpp_cli.training.validation import greedy_cider

    dec = importlib.import_module("rdpp_cli.decoding.decode")  # the module (the package exports the function)

    ws, ds, net, _ = unk_lover
    real_decode, seen = dec.decode, []

    def spy(model, att, cfg, **kw):
        out = real_decode(model, att, cfg, **kw)
        seen.append(out.tokens)
        return out

    from rdpp_cli.training import fast

    monkeypatch.setattr(fast, "decode", spy)  # validation decodes through the run's steps (training.fast.Steps)
    greedy_cider(net, ds, ds.split_indices("val"))
    toks = torch.cat([t.flatten() for t in seen])
    assert len(toks) and not (toks == unk_id(ds.words)).any()
    unk_only = real_decode(net.eval(), ds.features(ds.split_indices("val"))[1],
                           dec.DecodeConfig(method="greedy", max_len=4)).tokens
    assert (unk_only == unk_id(ds.words)).all()  # without suppression this model says nothing else


@pytest.mark.unit
def test_caption_method_help_names_exactly_the_decoders_methods():
    """cli/caption.py spells the methods out (importing them would import torch at start-up)."""
    import typer

    from rdpp_cli.decoding.decode import METHODS

    cmd = typer.main.get_command(app).commands["caption"]
    help_ = next(p for p in cmd.params if p.name == "method").help
    assert help_.removeprefix("One of: ").removesuffix(".").split(", ") == list(METHODS)
