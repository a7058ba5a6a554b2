"""features.h5: block writer and its hash, resume after an interruption, a real torchvision CNN,
local weights, and --features-from imports."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from typer.testing import CliRunner

from rdpp_cli.artifacts import content_hash, read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data import features as F
from rdpp_cli.data.backbones import IMAGENET_MEAN, IMAGENET_STD, PixelStats, build_backbone
from rdpp_cli.data.prepro import prepro_coco
from rdpp_cli.errors import RdppError

FIXTURE = Path(__file__).parent / "fixtures" / "karpathy_small.json"
runner = CliRunner()


def make_images(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for img in json.loads(FIXTURE.read_text())["images"]:
        p = root / img["filepath"] / img["filename"]
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(p)
    return root


def h5_content(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in f if not k.startswith("_")}, {k: f.attrs[k] for k in f.attrs}


def assert_same_features(a, b):
    (da, attrs_a), (db, attrs_b) = h5_content(a), h5_content(b)
    assert da.keys() == db.keys()
    for k in da:
        assert da[k].dtype == db[k].dtype and np.array_equal(da[k], db[k]), k
    assert {k: str(v) for k, v in attrs_a.items()} == {k: str(v) for k, v in attrs_b.items()}


# ---- the block writer -------------------------------------------------------------------------

@pytest.mark.unit
def test_writer_hash_equals_recomputed_hash_and_resumes(tmp_path):
    rng = np.random.default_rng(1)
    fc, att = rng.normal(size=(7, 3)), rng.normal(size=(7, 4, 3))
    ids = np.arange(100, 107)
    p = tmp_path / "f.h5"
    w = F.FeatureWriter(p, ids, fc_dim=3, regions=4, block=3, attrs={"backbone": "x", "att_size": 2})
    w.write(fc[:3], att[:3])
    with pytest.raises(ValueError):
        w.write(fc[3:5], att[3:5])  # a short block that is not the last
    w.close()
    w = F.FeatureWriter(p, ids, fc_dim=3, regions=4, block=3, attrs={"backbone": "x", "att_size": 2})
    assert w.done == 3  # resumed
    w.write(fc[3:6], att[3:6])
    w.write(fc[6:], att[6:])
    entry = w.finish()
    assert entry["hash_of"] == "h5rows:fc,att,image_ids;block=3"
    assert entry["sha256"] == content_hash.recompute(p, entry["hash_of"])
    with h5py.File(p, "r") as f:
        assert np.array_equal(f["fc"][:], fc.astype(np.float16))
        assert np.array_equal(f["att"][:], att.astype(np.float16))
        assert f["image_ids"][:].tolist() == ids.tolist() and int(f.attrs["_done"]) == 7
    # another layout (other ids) is not resumed: the file starts over
    w = F.FeatureWriter(p, ids + 1, fc_dim=3, regions=4, block=3, attrs={"backbone": "x", "att_size": 2})
    assert w.done == 0
    w.close()


@pytest.mark.unit
def test_pixstats_features_by_hand():
    """One red 8×8 square in the top-left cell of a white 16×16 image, 2×2 grid."""
    x = torch.ones(1, 3, 16, 16)
    x[0, 1:, :8, :8] = 0.0  # red: (1, 0, 0)
    fc, att = PixelStats(2)(x)
    assert att.shape == (1, 4, PixelStats.dim) and fc.shape == (1, PixelStats.dim)
    cell0, cell1 = att[0, 0], att[0, 1]
    assert cell0[:12].tolist() == [1, 1, 1, 1] + [0] * 8  # quarter means: R then G then B
    assert cell1[:12].tolist() == [1.0] * 12  # white
    assert cell0[12:15].tolist() == [0, 0, 0]  # flat colour: no spread
    assert cell0[19].item() == 1.0 and cell1[19].item() == 0.0  # saturation
    assert cell0[20:].tolist() == [0.25, 0.25] and att[0, 3, 20:].tolist() == [0.75, 0.75]
    assert cell1[13].item() == 0 and cell1[15].item() > 0  # an edge at the cell border: x-derivative
    assert torch.allclose(fc, att.mean(1))


# ---- interruption and resume --------------------------------------------------------------------

def _interrupt_after(monkeypatch, k, exc):
    calls = {"n": 0}
    real = F.FeatureWriter.write

    def write(self, *a, **kw):
        if calls["n"] == k:
            raise exc
        calls["n"] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(F.FeatureWriter, "write", write)
    return lambda: monkeypatch.setattr(F.FeatureWriter, "write", real)


@pytest.mark.integration
def test_interrupted_toy_extraction_resumes_to_the_same_content(tmp_path, monkeypatch):
    args = ["prepro", "toy", "--images", "50", "--batch-size", "10"]
    ref = runner.invoke(app, args + ["--out", str(tmp_path / "ref")])
    assert ref.exit_code == 0, ref.output
    ws = tmp_path / "runs"
    restore = _interrupt_after(monkeypatch, 2, KeyboardInterrupt())
    r = runner.invoke(app, args + ["--workspace", str(ws)])
    assert r.exit_code == 130 and "rerun the same command to resume" in r.stderr, r.output
    part = ws / "data" / "toy-v1"
    assert not (part / "manifest.json").exists()
    with h5py.File(part / "features.h5", "r") as f:
        assert int(f.attrs["_done"]) == 20
        done_rows = f["att"][:20].copy()
    restore()
    r = runner.invoke(app, args + ["--workspace", str(ws)])
    assert r.exit_code == 0, r.output
    assert "resuming unfinished" in r.stderr and "resuming feature extraction at image 20" in r.stderr
    assert not (ws / "data" / "toy-v2").exists()
    art = read_artifact(part, "rdpp.data")
    art.verify()
    assert_same_features(part / "features.h5", tmp_path / "ref" / "features.h5")
    with h5py.File(part / "features.h5", "r") as f:
        assert np.array_equal(f["att"][:20], done_rows)
    want = read_artifact(tmp_path / "ref", "rdpp.data").manifest["files"]
    assert {k: v["sha256"] for k, v in art.manifest["files"].items()} == {k: v["sha256"] for k, v in want.items()}


@pytest.mark.integration
def test_crash_in_cnn_extraction_resumes_to_the_same_content(tmp_path, monkeypatch):
    """A real (random-init, fixed seed) resnet18. The resumed run uses 2 DataLoader worker processes
    (workers do not change the output, so they may differ between the runs)."""
    images = make_images(tmp_path / "images")
    kw = dict(backbone="resnet18", pretrained=False, att_size=2, image_size=64, batch_size=2,
              word_count_threshold=1)
    ref = prepro_coco(FIXTURE, images, tmp_path / "ref", workers=0, **kw)
    restore = _interrupt_after(monkeypatch, 1, RuntimeError("machine lost"))
    with pytest.raises(RuntimeError, match="machine lost"):
        prepro_coco(FIXTURE, images, tmp_path / "run", workers=0, **kw)
    restore()
    with h5py.File(tmp_path / "run" / "features.h5", "r") as f:
        assert int(f.attrs["_done"]) == 2
    art = prepro_coco(FIXTURE, images, tmp_path / "run", workers=2, **kw)
    art.verify()
    assert art.config["workers"] == 2
    assert_same_features(art.path / "features.h5", ref.path / "features.h5")
    with h5py.File(art.path / "features.h5", "r") as f:
        assert f["fc"].shape == (4, 512) and f["att"].shape == (4, 4, 512) and f["fc"].dtype == np.float16
        assert f.attrs["backbone"] == "resnet18" and f.attrs["weights"] == "random init"
        fc, att = f["fc"][:].astype(np.float32), f["att"][:].astype(np.float32)
    # the same numbers by hand: torchvision resnet18 (seed 0) without its head, on the resized image
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    trunk = torch.nn.Sequential(*list(model.children())[:-2])
    im = Image.open(images / "val2014" / "c.png").convert("RGB").resize((64, 64), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1)
    x = (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
    with torch.no_grad():
        y = trunk(x[None])  # (1, 512, 2, 2)
    assert np.allclose(fc[2], y.mean((2, 3))[0].numpy(), rtol=2e-3, atol=2e-3)
    assert np.allclose(att[2], y.flatten(2).transpose(1, 2)[0].numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.integration
def test_local_weights_file_is_used(tmp_path):
    images = make_images(tmp_path / "images")
    torch.manual_seed(123)
    model = torchvision.models.resnet18(weights=None)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "r18.pth")
    kw = dict(backbone="resnet18", att_size=1, image_size=32, batch_size=4, workers=0, word_count_threshold=1,
              dtype="float32")
    art = prepro_coco(FIXTURE, images, tmp_path / "w", weights=tmp_path / "r18.pth", **kw)
    assert art.config["weights"] == str(tmp_path / "r18.pth")
    im = Image.open(images / "train2014" / "a.png").convert("RGB").resize((32, 32), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255).permute(2, 0, 1)
    x = (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
    with torch.no_grad():
        want = torch.nn.Sequential(*list(model.eval().children())[:-2])(x[None]).mean((2, 3))[0].numpy()
    with h5py.File(art.path / "features.h5", "r") as f:
        assert f["fc"].dtype == np.float32
        assert np.allclose(f["fc"][0], want, atol=1e-4)
    # weights of another architecture are refused in one line, before anything is written
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), tmp_path / "r34.pth")
    with pytest.raises(RdppError, match="do not fit resnet18"):
        prepro_coco(FIXTURE, images, tmp_path / "w34", weights=tmp_path / "r34.pth", **kw)
    assert not (tmp_path / "w34").exists()


@pytest.mark.unit
def test_other_torchvision_families_have_a_conv_trunk():
    for name, dim in (("mobilenet_v3_small", 576), ("squeezenet1_1", 512)):
        bb = build_backbone(name, att_size=3, image_size=64, pretrained=False)
        with torch.no_grad():
            fc, att = bb.module(torch.rand(2, 3, 64, 64))
        assert bb.dim == dim and fc.shape == (2, dim) and att.shape == (2, 9, dim), name


# ---- --features-from --------------------------------------------------------------------------------

IDS = [11, 22, 33, 44]


def _regions(seed):
    rng = np.random.default_rng(seed)
    return {i: rng.normal(size=(n, 6)).astype(np.float32) for i, n in zip(IDS, (3, 5, 1, 4))}


def _check_imported(art, regions, fcs=None):
    with h5py.File(art.path / "features.h5", "r") as f:
        assert f["att"].shape == (4, 5, 6) and f["fc"].shape == (4, 6) and f["att_len"][:].tolist() == [3, 5, 1, 4]
        assert f["image_ids"][:].tolist() == IDS and f.attrs["backbone"].startswith("imported")
        for row, i in enumerate(IDS):
            r = regions[i]
            assert np.allclose(f["att"][row, :len(r)], r, atol=2e-3)
            assert (f["att"][row, len(r):] == 0).all()
            want = fcs[i] if fcs else r.mean(0)
            assert np.allclose(f["fc"][row], want, atol=2e-3)
    art.verify()
    assert art.manifest["files"]["features.h5"]["hash_of"] == "h5rows:fc,att,att_len,image_ids;block=3"


@pytest.mark.integration
def test_import_folder_of_bottom_up_npz(tmp_path):
    regions = _regions(0)
    src = tmp_path / "bu"
    src.mkdir()
    for i, r in regions.items():
        np.savez(src / f"{i}.npz", feat=r)
    art = prepro_coco(FIXTURE, out=tmp_path / "a", features_from=src, word_count_threshold=1, batch_size=3)
    _check_imported(art, regions)
    assert art.config["backbone"] == "imported" and art.config["images_root"] is None


@pytest.mark.integration
def test_import_reads_no_image_so_it_needs_no_device_and_no_workers(tmp_path):
    """Imported features decode no photo: --device is not used (a GPU named on a machine without one
    is no error here) and no image-reading workers are started or recorded."""
    regions = _regions(0)
    src = tmp_path / "bu"
    src.mkdir()
    for i, r in regions.items():
        np.savez(src / f"{i}.npz", feat=r)
    art = prepro_coco(FIXTURE, out=tmp_path / "a", features_from=src, word_count_threshold=1, batch_size=3,
                      device="cuda")
    _check_imported(art, regions)
    assert art.config["workers"] == 0 and art.config["device"] == "cuda"


@pytest.mark.integration
def test_import_att_and_fc_subfolders_of_npy(tmp_path):
    regions, fcs = _regions(1), {i: np.full(6, float(i), np.float32) for i in IDS}
    (tmp_path / "src" / "cocobu_att").mkdir(parents=True)
    (tmp_path / "src" / "cocobu_fc").mkdir()
    for i in IDS:
        np.save(tmp_path / "src" / "cocobu_att" / f"{i}.npy", regions[i])
        np.save(tmp_path / "src" / "cocobu_fc" / f"{i}.npy", fcs[i])
    art = prepro_coco(FIXTURE, out=tmp_path / "a", features_from=tmp_path / "src", word_count_threshold=1,
                      batch_size=3)
    _check_imported(art, regions, fcs)


@pytest.mark.integration
def test_import_hdf5_per_id_and_arrays(tmp_path):
    regions = _regions(2)
    with h5py.File(tmp_path / "per_id.h5", "w") as f:
        for i, r in regions.items():
            f[str(i)] = r
        f["999"] = np.zeros((2, 6))  # extra ids are ignored
    art = prepro_coco(FIXTURE, out=tmp_path / "a", features_from=tmp_path / "per_id.h5", word_count_threshold=1,
                      batch_size=3)
    _check_imported(art, regions)
    # an rdpp features.h5 (fc/att arrays + image_ids + att_len) imports as itself
    art2 = prepro_coco(FIXTURE, out=tmp_path / "b", features_from=art.path / "features.h5",
                       word_count_threshold=1, batch_size=3)
    with h5py.File(art.path / "features.h5", "r") as a, h5py.File(art2.path / "features.h5", "r") as b:
        for k in ("fc", "att", "att_len", "image_ids"):
            assert np.array_equal(a[k][:], b[k][:]), k


@pytest.mark.integration
def test_import_missing_image_is_refused_before_writing(tmp_path):
    src = tmp_path / "bu"
    src.mkdir()
    for i, r in _regions(0).items():
        if i != 33:
            np.savez(src / f"{i}.npz", feat=r)
    with pytest.raises(RdppError, match="no features for 1 image.*id 33"):
        prepro_coco(FIXTURE, out=tmp_path / "a", features_from=src)
    assert not (tmp_path / "a").exists()
