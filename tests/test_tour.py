"""The README's tour: the mission's five commands exactly as users type them, in sequence, in a
workspace whose rdpp.yaml points `prepro coco` at the bundled data (small settings)."""

import json
import os
import subprocess
import sys


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
  val_images: 20
finetune:
  epochs: 1
  batch_size: 20
  val_images: 20
score:
  metrics: Bleu_4,CIDEr
"""


def test_the_five_commands_verbatim(tmp_path):
    generate_toy(tmp_path / "toy-source", images=150, seed=1)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rdpp.yaml").write_text(RDPP_YAML)
    env = {**os.environ, "RDPP_NO_PROGRESS": "1", "COLUMNS": "160"}
    env.pop("RDPP_WORKSPACE", None)
    rdpp = os.path.join(os.path.dirname(sys.executable), "rdpp")
    for line in TOUR:
        args = [rdpp, *line.split()[1:]]
        r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"

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
    assert len(samples) == 15 and all(len(s["captions"]) == 20 for s in samples)
    scores = json.loads((arts["scores/dpp-m5-v1.random-n20-v1"].path / "scores.json").read_text())
    assert set(scores) >= {"accuracy", "oracle", "diversity", "settings"}
    # the numbers, recomputed from samples.json and the data artifact by pycocoevalcap's own scorer
    want = cider_reference.scores_of_samples(arts["samples/dpp-m5-v1.random-n20-v1"].path, arts["data/coco-v1"].path)
    assert want["images"] == 15
    assert scores["accuracy"]["CIDEr"] == pytest.approx(want["mean_cider"], abs=1e-9)
    assert scores["oracle"]["CIDEr"] == pytest.approx(want["oracle_cider"], abs=1e-9)
    assert scores["diversity"]["self_cider"] == pytest.approx(want["self_cider"], abs=1e-6)
