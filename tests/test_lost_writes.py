"""A write the disk lost while reporting success (what an ``LD_PRELOAD`` shim dropping ``write`` or
``pwrite`` calls does) is caught when the file is read back, before the manifest records its hash:
one line naming the file, the folder left unfinished, and the same command, rerun, finishes it.

The fault is injected under the file object every atomic write gets (``os.fdopen``): the chosen
file's bytes are either dropped (a lost ``write``: the file ends shorter) or replaced by zeros (a lost
``pwrite``: the same size, a hole of zeros), while the writer is told they were written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rdpp_cli.artifacts import is_complete, read_artifact
from rdpp_cli.models import load_checkpoint

from helpers import WrappedFile, failure_line, model_artifact, rdpp, write_tiny_data

pytestmark = pytest.mark.integration


class _Lossy(WrappedFile):
    """A file object that loses its first write of at least ``least`` bytes (dropped or zeroed)."""

    def __init__(self, f, how: str, least: int, lost: list):
        super().__init__(f)
        self._how, self._least, self._lost = how, least, lost

    def write(self, data):
        n = len(memoryview(data).cast("B"))
        if not self._lost and n >= self._least:
            self._lost.append(n)
            if self._how == "zeroed":
                self._f.write(bytes(n))
            return n  # reported written
        return self._f.write(data)


def lose_a_write(monkeypatch, name: str, how: str, least: int = 1) -> list:
    """Lose one write (``how``: dropped or zeroed) of the next temp file written for ``name``; returns the
    list that gets the lost write's size."""
    real, lost = os.fdopen, []

    def fdopen(fd, *a, **kw):
        f = real(fd, *a, **kw)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if Path(target).name.startswith(f".{name}.") and "w" in (a[0] if a else kw.get("mode", "r")):
            return _Lossy(f, how, least, lost)
        return f

    monkeypatch.setattr(os, "fdopen", fdopen)
    return lost


@pytest.fixture
def ws(tmp_path):
    data = write_tiny_data(tmp_path / "ws" / "data" / "tiny-v1", n_train=16, n_val=4, n_test=2)
    return tmp_path / "ws", data


TRAIN = ("train-xe", "--preset", "small", "--epochs", "1", "--batch-size", "8", "--device", "cpu")


@pytest.mark.parametrize("name,how", [("best.pt", "zeroed"), ("last_state.pt", "dropped")])
def test_a_lost_checkpoint_write_is_caught_and_a_rerun_finishes(ws, tmp_path, monkeypatch, name, how):
    root, data = ws
    out = tmp_path / "m"
    with monkeypatch.context() as m:
        lost = lose_a_write(m, name, how, least=1024)
        r = rdpp(*TRAIN, "--data", data, "--workspace", root, "--out", out)
    assert lost, "the fault was never injected"
    failure_line(r, str(out / "checkpoints" / name), "a write was lost", "rerun the same command")
    assert not is_complete(out)  # never recorded as whole
    r = rdpp(*TRAIN, "--data", data, "--workspace", root, "--out", out)
    assert r.exit_code == 0, r.output
    ckpt = load_checkpoint(out / "checkpoints" / "best.pt")
    assert all(bool(v.abs().sum() > 0) for k, v in ckpt["state_dict"].items() if k.endswith("weight"))
    r = rdpp("verify", "--workspace", root, out)
    assert r.exit_code == 0 and "0 with problems" in r.output, r.output


@pytest.mark.parametrize("name,how", [("samples.json", "dropped"), ("manifest.json", "zeroed")])
def test_a_lost_samples_or_manifest_write_is_caught_and_a_rerun_finishes(ws, tmp_path, monkeypatch, name, how):
    root, data = ws
    model = model_artifact(root, read_artifact(data))
    out = tmp_path / "s"
    args = ("sample", model.path, "--n", "2", "--method", "greedy", "--device", "cpu", "--workspace", root,
            "--out", out)
    with monkeypatch.context() as m:
        lost = lose_a_write(m, name, how)
        r = rdpp(*args)
    assert lost, "the fault was never injected"
    failure_line(r, str(out / name), "a write was lost", "rerun the same command")
    assert not is_complete(out)
    for force in ([], ["--force"]):  # resumed as the unfinished run it is, with or without --force
        r = rdpp(*args, *force)
        assert r.exit_code == 0, r.output
    recs = json.loads((read_artifact(out, "rdpp.samples").file("samples.json")).read_text())
    assert len(recs) == 2 and all(len(rec["captions"]) == 2 for rec in recs)
    assert torch.isfinite(torch.tensor([lp for rec in recs for lp in rec["logprobs"]])).all()


@pytest.mark.parametrize("name", ["000003.png"])
def test_a_lost_write_of_a_toy_image_is_caught_and_a_rerun_finishes(tmp_path, monkeypatch, name):
    """The toy set's images are read back like every file rdpp writes (before, PIL wrote them straight)."""
    args = ("prepro", "toy", "--images", "30", "--workspace", tmp_path / "ws")
    with monkeypatch.context() as m:
        lost = lose_a_write(m, name, "zeroed")
        r = rdpp(*args)
    assert lost, "the fault was never injected"
    failure_line(r, name, "a write was lost", "rerun the same command")
    assert not is_complete(tmp_path / "ws" / "data" / "toy-v1")
    r = rdpp(*args)
    assert r.exit_code == 0, r.output
    assert is_complete(tmp_path / "ws" / "data" / "toy-v1")
