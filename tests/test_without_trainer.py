"""The evaluator without the trainer: with torch and torchvision not importable (as after `pip install
rdpp`, core only), `rdpp score` (a results file against COCO annotations, and a samples artifact
against its data artifact), `rdpp ls`, `rdpp verify` and `rdpp plot` run end to end, and every command
that needs the trainer says so in one line with the install command (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from rdpp_cli.artifacts import read_artifact, write_manifest

from helpers import rdpp, write_tiny_data

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
RDPP = Path(sys.executable).parent / "rdpp"
DATA = Path(__file__).parent / "data" / "coco-val2014-1k"
FAST = "Bleu_1,Bleu_4,ROUGE_L,CIDEr"  # no METEOR: its JVM takes seconds to start

# sitecustomize runs at interpreter start, before rdpp: from then on torch and torchvision cannot be
# imported, exactly as when they are not installed (ModuleNotFoundError naming the module).
BLOCKER = '''\
import sys


class NoTrainer:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTrainer())
'''


@pytest.fixture(scope="module")
def no_trainer(tmp_path_factory) -> dict:
    site = tmp_path_factory.mktemp("no-trainer")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(site), "RDPP_NO_PROGRESS": "1", "COLUMNS": "200"}
    env.pop("RDPP_WORKSPACE", None)
    r = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert r.returncode == 1 and "No module named 'torch'" in r.stderr  # the blocker works
    return env


def run(env: dict, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(RDPP), *map(str, args)], env=env, capture_output=True, text=True, timeout=300)


def scores(path: Path) -> dict:
    s = json.loads((path / "scores.json").read_text())
    return {k: s[k] for k in ("accuracy", "oracle", "diversity") if k in s}


def test_score_a_results_file_against_coco_annotations_without_torch(no_trainer, tmp_path):
    args = [DATA / "fakecap_results.json", "--refs", DATA / "captions_val2014_1k.json", "--metrics", FAST]
    r = run(no_trainer, "score", *args, "--out", tmp_path / "s")
    assert r.returncode == 0, r.stdout + r.stderr
    # the numbers of the same command with torch importable (this process)
    assert rdpp("score", *args, "--out", tmp_path / "t").exit_code == 0
    got = scores(tmp_path / "s")
    assert got == scores(tmp_path / "t") and got["accuracy"]["CIDEr"] > 0.5  # coco-caption's example: 0.5998


def make_samples(ws: Path) -> Path:
    """A samples artifact of the tiny data artifact's test images, three captions each."""
    data = read_artifact(write_tiny_data(ws / "data" / "tiny-v1"), "rdpp.data")
    path = ws / "samples" / "random-n3-v1"
    path.mkdir(parents=True)
    caps = ["a red circle", "a circle that is red", "one blue square on a plain background"]
    (path / "samples.json").write_text(json.dumps(
        [{"image_id": 1000 + i, "captions": caps[k:] + caps[:k], "logprobs": [-1.0] * 3}
         for k, i in enumerate(range(32, 36))]))
    write_manifest(path, "rdpp.samples", {"method": "random", "n": 3, "split": "test"}, inputs=[data])
    return path


def test_score_a_samples_artifact_ls_verify_and_plot_without_torch(no_trainer, tmp_path):
    samples = make_samples(tmp_path)
    args = ["--oracle", "--self-cider", "--diversity", "--metrics", FAST, "--workspace", tmp_path]
    r = run(no_trainer, "score", samples, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rdpp("score", samples, *args, "--out", tmp_path / "t").exit_code == 0  # with torch importable
    got = scores(tmp_path / "scores" / "random-n3-v1")
    assert got == scores(tmp_path / "t")
    assert got["accuracy"]["CIDEr"] > 0 and got["diversity"]["self_cider"] > 0

    r = run(no_trainer, "ls", "--workspace", tmp_path)
    assert r.returncode == 0 and "random-n3-v1" in r.stdout and "tiny-v1" in r.stdout, r.stdout + r.stderr
    r = run(no_trainer, "verify", "--workspace", tmp_path)
    assert r.returncode == 0 and "0 with problems" in r.stdout, r.stdout + r.stderr
    r = run(no_trainer, "plot", "--workspace", tmp_path, "--out", tmp_path / "plot.png")
    assert r.returncode == 0 and (tmp_path / "plot.png").stat().st_size > 1000, r.stdout + r.stderr


@pytest.mark.parametrize("command", [["train-xe"], ["finetune"], ["sample"], ["caption", "x.jpg"], ["demo"],
                                     ["prepro", "toy"], ["prepro", "coco", "--captions", "x.csv"]])
def test_a_trainer_command_says_how_to_install_the_trainer(no_trainer, tmp_path, command):
    r = run(no_trainer, *command, "--workspace", tmp_path / "ws")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    name = " ".join(command[:2] if command[0] == "prepro" else command[:1])
    assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith(f"error: rdpp {name} needs the trainer (torch is not installed)"), lines[0]
    assert "pip install 'rdpp[train]'" in lines[0]
    assert "Traceback" not in r.stdout + r.stderr and not (tmp_path / "ws").exists()


@pytest.mark.slow  # ~55 s (a fresh venv); the tests above run the same commands with torch hidden
def test_core_install_in_a_fresh_venv_scores_without_torch(tmp_path):
    """`pip install .` (core only, from the package index or pip's cache) into a new virtual
    environment: no torch is installed, and `rdpp score` scores a results file."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], env=env, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(py), "-c", "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('torchvision'))"],
                       env=env, capture_output=True, text=True)
    assert r.stdout.split() == ["None", "None"], r.stdout + r.stderr
    r = subprocess.run([str(env_dir / "bin" / "rdpp"), "score", str(DATA / "fakecap_results.json"), "--refs",
                        str(DATA / "captions_val2014_1k.json"), "--metrics", FAST, "--out", str(tmp_path / "s")],
                       env={**env, "RDPP_NO_PROGRESS": "1"}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rdpp("score", DATA / "fakecap_results.json", "--refs", DATA / "captions_val2014_1k.json", "--metrics", FAST,
                "--out", tmp_path / "t").exit_code == 0
    assert scores(tmp_path / "s") == scores(tmp_path / "t")
    r = subprocess.run([str(env_dir / "bin" / "rdpp"), "train-xe", "--workspace", str(tmp_path / "ws")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "pip install 'rdpp[train]'" in r.stderr, r.stdout + r.stderr
