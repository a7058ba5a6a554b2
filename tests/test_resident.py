"""Resident training features (``CaptionBatches(resident="auto")``, ``--resident``; docs/data.md):
where they fit, every feature row is read once and the batches are gathered from memory -- the
same batches, byte for byte, as read from the file, for a fresh and for a resumed epoch."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from rdpp_cli.artifacts import write_manifest
from rdpp_cli.data import loader as LD
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches, ResidentFeatures, residency
from rdpp_cli.errors import RdppError

from helpers import write_tiny_data

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> DataArtifact:
    """Tiny data whose images have 3 to 16 valid regions (``att_len``): the batches carry a mask."""
    path = write_tiny_data(Path(tmp_path_factory.mktemp("d")) / "tiny", n_train=21, n_val=4, n_test=2)
    with h5py.File(path / "features.h5", "a") as f:
        f["att_len"] = (np.arange(f["att"].shape[0]) % 14 + 3).astype(np.int32)
        n = f["att"].shape[0]
    write_manifest(path, "rdpp.data", {"source": "tiny-test", "images": n}, summary={"images": n})
    return DataArtifact.open(path)


def _same(a, b) -> None:
    assert np.array_equal(a.index, b.index) and (a.epoch, a.batch) == (b.epoch, b.batch)
    for name in ("fc", "att", "att_mask", "labels"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.device == y.device and torch.equal(x, y), name


@pytest.mark.parametrize("workers", [0, 2])
def test_resident_batches_are_the_batches_read_from_the_file(data, workers):
    kw = dict(batch_size=4, seq_per_img=5, seed=3, num_workers=workers)
    disk = CaptionBatches(data, "train", resident="off", **kw)
    ram = CaptionBatches(data, "train", resident="auto", **kw)
    assert disk.resident is None and ram.resident is not None and ram.resident.place == "ram"
    assert ram.resident.nbytes == 21 * (data.fc_dim + data.att_regions * data.att_dim) * 2  # float16, once each
    for epoch in (0, 1):
        got, want = list(ram.epoch(epoch)), list(disk.epoch(epoch))
        assert len(got) == len(want) == 6
        for a, b in zip(got, want):
            _same(a, b)
        assert want[0].att_mask is not None and not want[0].att_mask.all()
    for a, b in zip(ram.epoch(1, start=4), disk.epoch(1, start=4)):  # a resumed run's rest of the epoch
        _same(a, b)
    for a, b in zip(ram.epoch(1, start=4), list(disk.epoch(1))[4:]):
        _same(a, b)


def test_where_the_features_are_kept(monkeypatch):
    """On a CPU: in RAM up to HOST_SHARE of the available memory, else read from the file."""
    monkeypatch.setattr(LD, "available_ram", lambda: 1000)
    cpu = torch.device("cpu")
    assert residency(500, cpu) == "ram" and residency(501, cpu) is None
    assert residency(0, cpu) == "ram"


def test_a_setting_that_is_not_one(data):
    with pytest.raises(RdppError, match=r"^--resident 'on' is not a residency setting; use one of auto, off$"):
        CaptionBatches(data, "train", batch_size=4, resident="on")


def test_features_too_big_are_read_from_the_file(data, monkeypatch):
    monkeypatch.setattr(LD, "available_ram", lambda: 1000)
    assert CaptionBatches(data, "train", batch_size=4, resident="auto").resident is None
    monkeypatch.setattr(LD, "available_ram", lambda: 10 ** 12)
    assert CaptionBatches(data, "train", batch_size=4).resident is None  # the loader alone: off unless asked
    assert isinstance(CaptionBatches(data, "train", batch_size=4, resident="auto").resident, ResidentFeatures)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_features_are_kept_on_it_and_the_batches_are_the_same(data):
    kw = dict(batch_size=4, seq_per_img=5, seed=3, pin_memory=True, device="cuda")
    gpu = CaptionBatches(data, "train", resident="auto", **kw)
    disk = CaptionBatches(data, "train", resident="off", **kw)
    assert gpu.resident.place == "device" and gpu.resident.att.is_cuda
    for a, b in zip(gpu.epoch(1), disk.epoch(1)):
        _same(a.to("cuda"), b.to("cuda"))
