"""Bad input to `rdpp prepro coco|toy`: one clear line, exit 2, nothing on disk created or damaged."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "fixtures" / "karpathy_small.json"
runner = CliRunner()


def make_images(root: Path, data: dict) -> Path:
    from PIL import Image

    for img in data["images"]:
        p = root / img["filepath"] / img["filename"]
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (200, 30, 30)).save(p)
    return root


@pytest.fixture
def coco(tmp_path):
    """A valid fixture set: (json path, images root, workspace)."""
    data = json.loads(FIXTURE.read_text())
    js = tmp_path / "dataset_coco.json"
    js.write_text(json.dumps(data))
    return js, make_images(tmp_path / "images", data), tmp_path / "runs"


def prepro(js, images, ws, *extra):
    args = ["prepro", "coco", "--workspace", str(ws), "--backbone", "pixstats", "--att-size", "2",
            "--image-size", "16", "--workers", "0", "--word-count-threshold", "1"]
    if js is not None:
        args += ["--karpathy-json", str(js)]
    if images is not None:
        args += ["--images-root", str(images)]
    return runner.invoke(app, args + [str(e) for e in extra], env={"COLUMNS": "300"})


def one_line_error(result, *fragments, only=True):
    """Exit 2 and one error line holding ``fragments``; with ``only``, nothing else on stderr."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    if not only:
        lines = [ln for ln in lines if ln.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for frag in fragments:
        assert frag in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def nothing_written(ws):
    return not ws.exists() or not any(p.is_file() for p in ws.rglob("*"))


def test_valid_fixture_passes(coco):
    js, images, ws = coco
    r = prepro(js, images, ws)
    assert r.exit_code == 0, r.output
    read_artifact(ws / "data" / "coco-v1", "rdpp.data").verify()


def test_missing_json(coco):
    js, images, ws = coco
    line = one_line_error(prepro(js.with_name("nope.json"), images, ws), "nope.json", "does not exist",
                          "--karpathy-json")
    assert nothing_written(ws), line


def test_malformed_json(coco):
    js, images, ws = coco
    js.write_text('{"images": [ {"filename": "a.png",, } ]}')
    one_line_error(prepro(js, images, ws), str(js), "not valid JSON", "line 1")
    assert nothing_written(ws)


def test_json_without_images(coco):
    js, images, ws = coco
    js.write_text(json.dumps({"annotations": []}))
    one_line_error(prepro(js, images, ws), str(js), "no 'images' list")
    assert nothing_written(ws)


def test_missing_image_file(coco):
    js, images, ws = coco
    (images / "val2014" / "c.png").unlink()
    one_line_error(prepro(js, images, ws), "c.png", "missing", "--images-root")
    assert nothing_written(ws)


def test_file_that_is_not_an_image(coco):
    js, images, ws = coco
    (images / "val2014" / "d.png").write_bytes(b"this is not a png at all")
    one_line_error(prepro(js, images, ws), "d.png", "not an image")
    assert nothing_written(ws)


def test_truncated_image_is_named_before_anything_is_written(coco):
    """A file cut short (header intact, no end marker): found by the up-front check, one line."""
    js, images, ws = coco
    bad = images / "val2014" / "c.png"
    bad.write_bytes(bad.read_bytes()[:60])
    one_line_error(prepro(js, images, ws), "c.png", "truncated or damaged")
    assert nothing_written(ws)


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "PPM"])
def test_truncated_photo_without_end_marker_is_decoded_up_front(coco, fmt):
    """A format with no end marker to look at (BMP, TIFF, PPM), cut short: the up-front check decodes it
    in full, so it is named before any folder is made (not halfway through extraction)."""
    import io

    from PIL import Image

    js, images, ws = coco
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (9, 99, 199)).save(buf, fmt)
    (images / "val2014" / "c.png").write_bytes(buf.getvalue()[:len(buf.getvalue()) * 2 // 3])
    one_line_error(prepro(js, images, ws), "c.png", "truncated or damaged")
    assert nothing_written(ws)


def test_image_that_breaks_while_decoding_is_named_and_run_resumes(coco):
    """A file whose header and end are fine but whose data is damaged: found during extraction (no
    manifest is written), named in one line; after fixing it the same command resumes and finishes."""
    js, images, ws = coco
    bad = images / "val2014" / "c.png"
    good = bad.read_bytes()
    broken = bytearray(good)
    start = good.index(b"IDAT") + 6
    broken[start:start + 8] = bytes(b ^ 0xFF for b in broken[start:start + 8])  # damage the pixel data only
    bad.write_bytes(bytes(broken))
    one_line_error(prepro(js, images, ws, "--batch-size", "1"), "c.png", "could not be decoded", only=False)
    assert not (ws / "data" / "coco-v1" / "manifest.json").exists()
    bad.write_bytes(good)
    r = prepro(js, images, ws, "--batch-size", "1")
    assert r.exit_code == 0, r.output
    assert "resuming" in r.stderr
    assert (ws / "data" / "coco-v1" / "manifest.json").exists() and not (ws / "data" / "coco-v2").exists()
    read_artifact(ws / "data" / "coco-v1", "rdpp.data").verify()


def test_empty_caption(coco):
    js, images, ws = coco
    data = json.loads(js.read_text())
    data["images"][2]["sentences"][1]["tokens"] = []
    js.write_text(json.dumps(data))
    one_line_error(prepro(js, images, ws), "image 33", "empty caption", "sentence 1")
    assert nothing_written(ws)


def test_no_paths_and_no_data_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RDPP_COCO_ROOT", raising=False)
    r = runner.invoke(app, ["prepro", "coco"], env={"COLUMNS": "300"})
    line = one_line_error(r, "data/coco/dataset_coco.json", "$RDPP_COCO_ROOT", "rdpp.yaml", "--karpathy-json",
                          "--images-root")
    assert "runs/rdpp.yaml" in line
    assert not (tmp_path / "runs").exists()


def test_no_images_root_found(coco, tmp_path, monkeypatch):
    js, images, ws = coco
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RDPP_COCO_ROOT", raising=False)
    shutil.rmtree(images)
    one_line_error(prepro(js, None, ws), "train2014/a.png", "--images-root", "looked in")
    assert nothing_written(ws)


def test_paths_from_workspace_yaml(coco):
    js, images, ws = coco
    ws.mkdir()
    (ws / "rdpp.yaml").write_text(f"prepro_coco:\n  karpathy_json: {js}\n  images_root: {images}\n")
    r = prepro(None, None, ws)
    assert r.exit_code == 0, r.output
    art = read_artifact(ws / "data" / "coco-v1", "rdpp.data")
    assert art.config["karpathy_json"] == str(js)


def test_pretrained_weights_unavailable_offline(coco, monkeypatch, tmp_path):
    js, images, ws = coco
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # an empty hub cache
    r = runner.invoke(app, ["prepro", "coco", "--karpathy-json", str(js), "--images-root", str(images),
                            "--workspace", str(ws), "--backbone", "resnet18"], env={"COLUMNS": "300"})
    one_line_error(r, "ImageNet weights for resnet18", "--weights", "--no-pretrained")
    assert nothing_written(ws)


def test_bad_weights_file_and_unknown_backbone(coco, tmp_path):
    js, images, ws = coco
    bad = tmp_path / "w.pth"
    bad.write_bytes(b"not a checkpoint")
    one_line_error(prepro(js, images, ws, "--backbone", "resnet18", "--weights", bad), "w.pth", "could not be loaded")
    one_line_error(prepro(js, images, ws, "--backbone", "resnet_9000"), "unknown backbone 'resnet_9000'")
    one_line_error(prepro(js, images, ws, "--backbone", "vit_b_16"), "unknown backbone 'vit_b_16'")
    assert nothing_written(ws)


def test_out_folder_holding_another_artifact_is_refused_unless_force(coco, tmp_path):
    js, images, ws = coco
    toy = tmp_path / "toy"
    r = runner.invoke(app, ["prepro", "toy", "--out", str(toy), "--images", "20"])
    assert r.exit_code == 0, r.output
    before = {p.relative_to(toy): p.read_bytes() for p in toy.rglob("*") if p.is_file()}
    line = one_line_error(prepro(js, images, ws, "--out", toy), str(toy), "already holds rdpp.data", "--force")
    assert {p.relative_to(toy): p.read_bytes() for p in toy.rglob("*") if p.is_file()} == before, line
    read_artifact(toy, "rdpp.data").verify()
    # a folder of unrelated files is refused too, and left as it was
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    one_line_error(prepro(js, images, ws, "--out", other), "not an rdpp artifact", "--force")
    assert (other / "notes.txt").read_text() == "mine"
    r = prepro(js, images, ws, "--out", toy, "--force")
    assert r.exit_code == 0, r.output
    art = read_artifact(toy, "rdpp.data")
    art.verify()
    assert art.config["source"] == "coco" and not (toy / "source").exists()


def test_out_over_the_caption_file_or_the_images_is_refused_even_with_force(coco):
    js, images, ws = coco
    before = {p: p.read_bytes() for p in js.parent.rglob("*") if p.is_file()}
    one_line_error(prepro(js, images, ws, "--out", js.parent, "--force"), f"--out {js.parent} holds {js}, which "
                   "this stage reads", only=False)
    one_line_error(prepro(js, images, ws, "--out", images / "val2014", "--force"), f"lies inside {images}",
                   only=False)
    assert {p: p.read_bytes() for p in js.parent.rglob("*") if p.is_file()} == before


def test_bad_option_values(coco):
    js, images, ws = coco
    one_line_error(prepro(js, images, ws, "--max-length", "0"), "--max-length must be at least 1 (got 0)")
    one_line_error(prepro(js, images, ws, "--batch-size", "0"), "--batch-size must be at least 1 (got 0)")
    r = runner.invoke(app, ["prepro", "toy", "--images", "3", "--workspace", str(ws)])
    one_line_error(r, "--images 3", "at least 10")
    assert nothing_written(ws)
