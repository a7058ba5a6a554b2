"""The README's tour: the mission's five commands exactly as users type them, in sequence, in a
workspace whose rdpp.yaml points `prepro coco` at the bundled data (small settings)."""

import json
import os
import subprocess
import sys
from pathlib import Path


import pytest

from rdpp_cli.artifacts import list_artifacts
from rdpp_cli.data.toy import generate_toy

import cider_reference

pytestmark = pytest.mark.integration


TOUR = [
    "rdpp prepro coco",
    "rdpp train-xe",
    "rdpp finetune --reward dpp --m 5",
    "rdpp sample --n 20 --method random",
    "rdpp score --oracle --self-cider",
]

RDPP_YAML = """\
# the bundled synthetic set standing in for COCO (docs/workspace.md)
prepro_coco:
  karpathy_json: toy-source/dataset_toy.json
  images_root: toy-source
  backbone: pixstats
  att_size: 8
train_xe:
  preset: small
  epochs: 1
  val_images: 6
finetune:
  epochs: 1
  batch_size: 16
  val_images: 6
score:
  metrics: Bleu_4,CIDEr
"""


def run_verbatim(lines: list[str], cwd: Path) -> None:
    """Each command line as a user types it, with the installed `rdpp`, in ``cwd``."""
    env = {**os.environ, "RDPP_NO_PROGRESS": "1", "COLUMNS": "160"}
    env.pop("RDPP_WORKSPACE", None)
    rdpp = os.path.join(os.path.dirname(sys.executable), "rdpp")
    for line in lines:
        r = subprocess.run([rdpp, *line.split()[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"


def test_the_five_commands_verbatim(tmp_path):
    generate_toy(tmp_path / "toy-source", images=60, seed=1)  # 48 train, 6 val, 6 test images
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rdpp.yaml").write_text(RDPP_YAML)
    run_verbatim(TOUR, tmp_path)

    arts = {a.path.parent.name + "/" + a.name: a for a in list_artifacts(tmp_path / "runs")}
    assert set(arts) == {"data/coco-v1", "xe/att2in-small-v1", "finetune/dpp-m5-v1",
                         "samples/dpp-m5-v1.random-n20-v1", "scores/dpp-m5-v1.random-n20-v1"}, sorted(arts)
    # each stage took the newest artifact of the previous one
    def came_from(name):
        return {i["name"] for i in arts[name].inputs}
    assert "coco-v1" in came_from("xe/att2in-small-v1")
    assert "att2in-small-v1" in came_from("finetune/dpp-m5-v1")
    assert "dpp-m5-v1" in came_from("samples/dpp-m5-v1.random-n20-v1")
    assert "dpp-m5-v1.random-n20-v1" in came_from("scores/dpp-m5-v1.random-n20-v1")
    assert arts["data/coco-v1"].config["backbone"] == "pixstats"  # from rdpp.yaml
    assert arts["finetune/dpp-m5-v1"].config["reward"] == "dpp" and arts["finetune/dpp-m5-v1"].config["m"] == 5

    samples = json.loads((arts["samples/dpp-m5-v1.random-n20-v1"].path / "samples.json").read_text())
    assert len(samples) == 6 and all(len(s["captions"]) == 20 for s in samples)
    scores = json.loads((arts["scores/dpp-m5-v1.random-n20-v1"].path / "scores.json").read_text())
    assert set(scores) >= {"accuracy", "oracle", "diversity", "settings"}
    # the numbers, recomputed from samples.json and the data artifact by pycocoevalcap's own scorer
    want = cider_reference.scores_of_samples(arts["samples/dpp-m5-v1.random-n20-v1"].path, arts["data/coco-v1"].path)
    assert want["images"] == 6
    assert scores["accuracy"]["CIDEr"] == pytest.approx(want["mean_cider"], abs=1e-9)
    assert scores["oracle"]["CIDEr"] == pytest.approx(want["oracle_cider"], abs=1e-9)
    assert scores["diversity"]["self_cider"] == pytest.approx(want["self_cider"], abs=1e-6)


OWN_TOUR = [  # README, "Your own dataset"
    "rdpp prepro coco --captions mine.csv --backbone mobilenet_v2 --weights mobilenet_v2-b0353104.pth",
    "rdpp train-xe",
    "rdpp finetune --reward dpp --m 5",
    "rdpp sample --n 5 --method random",
    "rdpp score --oracle --self-cider",
    "rdpp caption new_photos/ --method random --n 5",
]

OWN_YAML = """\
# small settings for a test; the commands are the README's
prepro_coco:
  image_size: 64
  att_size: 2
train_xe:
  preset: small
  epochs: 1
finetune:
  epochs: 1
  batch_size: 20
score:
  metrics: Bleu_4,CIDEr
"""


@pytest.mark.slow  # ~35 s on 2 idle cores; the own-data routes are checked in test_caption_files.py
def test_the_own_dataset_commands_verbatim(tmp_path):
    """A CSV of image,caption rows (no split column: the hash rule splits it) beside a folder of
    photos, then the README's commands as typed; `rdpp caption` on new photos of several sizes and
    formats, among them small RGB JPEGs (thumbnails no larger than the contact sheet's)."""
    import csv

    from PIL import Image

    from helpers import headless_mobilenet

    src = json.loads(generate_toy(tmp_path / "toy", images=80, seed=2).read_text())
    (tmp_path / "photos").mkdir()
    with open(tmp_path / "mine.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "caption"])
        for im in src["images"]:
            (tmp_path / "toy" / "images" / im["filename"]).rename(tmp_path / "photos" / im["filename"])
            w.writerows([f"photos/{im['filename']}", s["raw"]] for s in im["sentences"])
    (tmp_path / "new_photos").mkdir()
    for k, size in enumerate([(64, 64), (120, 90), (500, 300)]):
        with Image.open(tmp_path / "photos" / src["images"][k]["filename"]) as im:
            im.convert("RGB").resize(size).save(tmp_path / "new_photos" / f"mine{k}.jpg")
    headless_mobilenet(tmp_path / "mobilenet_v2-b0353104.pth")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rdpp.yaml").write_text(OWN_YAML)
    run_verbatim(OWN_TOUR, tmp_path)

    arts = {a.path.parent.name + "/" + a.name: a for a in list_artifacts(tmp_path / "runs")}
    data = arts["data/captions-v1"]
    assert data.config["captions"][0]["format"] == "csv" and (data.path / "dataset.json").is_file()
    assert data.manifest["summary"]["images"] == 80 and min(data.manifest["summary"][s] for s in ("val", "test")) >= 1
    caps = next(a for name, a in arts.items() if name.startswith("captions/"))
    results = json.loads((caps.path / "results.json").read_text())
    assert [Path(e["file"]).name for e in results] == ["mine0.jpg", "mine1.jpg", "mine2.jpg"]
    assert all(len(e["captions"]) == 5 for e in results)
    assert (caps.path / "contact_sheet.html").read_text().count("data:image/jpeg;base64,") == 3
