"""`rdpp score results.json --refs <COCO annotation file>` gives pycocoevalcap's COCOEvalCap numbers on
the same two files, to 1e-6: on the six photos of tests/data/coco-real-6 (anywhere), and against
the official captions_val2017.json (5,000 images) of ../shared (CI; skipped where it is absent)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdpp_cli.cli.app import app

REAL6 = Path(__file__).parent / "data" / "coco-real-6"
SHARED = Path(os.environ.get("RDPP_SHARED", Path(__file__).resolve().parents[2] / "shared"))
VAL2017 = SHARED / "data" / "coco-real-390" / "captions_val2017.json"
METRICS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
NO_METEOR = tuple(m for m in METRICS if m != "METEOR")  # METEOR's JVM takes many seconds to start

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("RDPP_JAVA"),
                                 reason="java is needed by the PTB tokenizer and METEOR")]


def results_from_other_images(annotations: dict, image_ids: list[int]) -> list[dict]:
    """Plausible captions with partial overlap: image k gets a reference sentence of image k+1 (and
    the first image one of its own), written as people write them (capitals, punctuation)."""
    refs: dict[int, list[str]] = {}
    for a in annotations["annotations"]:
        refs.setdefault(a["image_id"], []).append(a["caption"])
    out = [{"image_id": image_ids[0], "caption": refs[image_ids[0]][2]}]
    for k, i in enumerate(image_ids[1:], 1):
        out.append({"image_id": i, "caption": refs[image_ids[(k + 1) % len(image_ids)]][k % 5]})
    return out


def _left_out(name: str):
    class LeftOut:
        def compute_score(self, gts, res):
            return 0.0, [0.0] * len(res)

        def method(self):
            return name

    return LeftOut


def coco_eval_cap(ann_file: Path, res_file: Path, monkeypatch, metrics=METRICS) -> dict[str, float]:
    """pycocoevalcap's own evaluation, as its README runs it (SPICE left out: it downloads Stanford
    CoreNLP on first use; METEOR when not in ``metrics``)."""
    import pycocoevalcap.eval as E
    from pycocotools.coco import COCO

    monkeypatch.setattr(E, "Spice", _left_out("SPICE"))
    if "METEOR" not in metrics:
        monkeypatch.setattr(E, "Meteor", _left_out("METEOR"))
    coco = COCO(str(ann_file))
    res = coco.loadRes(str(res_file))
    ev = E.COCOEvalCap(coco, res)
    ev.params["image_id"] = res.getImgIds()
    ev.evaluate()
    return ev.eval


def rdpp_score(ann_file: Path, res_file: Path, ws: Path, metrics=METRICS) -> dict[str, float]:
    r = CliRunner().invoke(app, ["score", str(res_file), "--refs", str(ann_file), "--workspace", str(ws),
                                 "--metrics", ",".join(metrics), "--out", str(ws / "s")])
    assert r.exit_code == 0, r.output
    return json.loads((ws / "s" / "scores.json").read_text())["accuracy"]


def _same(ann_file: Path, image_ids: list[int], tmp_path: Path, monkeypatch, metrics=METRICS) -> dict[str, float]:
    res_file = tmp_path / "results.json"
    res_file.write_text(json.dumps(results_from_other_images(json.loads(ann_file.read_text()), image_ids)))
    ours = rdpp_score(ann_file, res_file, tmp_path / "ws", metrics)
    theirs = coco_eval_cap(ann_file, res_file, monkeypatch, metrics)
    for m in metrics:
        assert ours[m] == pytest.approx(theirs[m], abs=1e-6), m
    return ours


def test_score_equals_coco_eval_cap_on_the_six_photos(tmp_path, monkeypatch):
    ann = REAL6 / "captions_val2017_6.json"
    ids = [im["id"] for im in json.loads(ann.read_text())["images"]]
    ours = _same(ann, ids, tmp_path, monkeypatch, NO_METEOR)
    assert 0 < ours["CIDEr"] < 3 and 0 < ours["Bleu_1"] < 1


@pytest.mark.slow  # ~30 s (5,000 images); the six photos above check the same route in the default run
@pytest.mark.skipif(not VAL2017.is_file(), reason=f"the official COCO val2017 captions are not here ({VAL2017})")
def test_score_equals_coco_eval_cap_against_the_official_val2017_file(tmp_path, monkeypatch):
    """Results for 100 of the 5,000 images (those of coco-real-390), scored against the whole file,
    every metric from BLEU to CIDEr (METEOR included)."""
    karpathy = json.loads((VAL2017.parent / "dataset_coco390.json").read_text())
    ids = [im["cocoid"] for im in karpathy["images"] if im["filepath"] == "val2017"][:100]
    ours = _same(VAL2017, ids, tmp_path, monkeypatch)
    assert 0 < ours["CIDEr"] < 1


def test_a_copied_training_caption_is_not_novel_although_written_otherwise(tmp_path):
    """The data artifact keeps the training captions as written ("A couple of airplanes flying under a
    cloudy sky."); a generated copy of one is not a novel caption."""
    from rdpp_cli.data.prepro import prepro_coco

    data = prepro_coco(REAL6 / "dataset_coco6.json", REAL6 / "images", tmp_path / "data", backbone="pixstats",
                       att_size=2, image_size=16, workers=0)
    res = tmp_path / "samples.json"
    res.write_text(json.dumps([{"image_id": 8762, "captions": ["a couple of airplanes flying under a cloudy sky",
                                                               "a street sign at night"]}]))
    r = CliRunner().invoke(app, ["score", str(res), "--data", str(data.path), "--split", "test", "--diversity",
                                 "--metrics", "CIDEr", "--workspace", str(tmp_path), "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s" / "scores.json").read_text())["diversity"]["novel"] == 0.5
