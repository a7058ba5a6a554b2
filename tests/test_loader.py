"""The training loader: only the batch's rows, seeded order, exact resume position, DDP shares."""

from __future__ import annotations


import h5py
import numpy as np
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches

from helpers import write_tiny_data

pytestmark = pytest.mark.unit

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return DataArtifact.open(write_tiny_data(tmp_path_factory.mktemp("data") / "tiny",
                                             extra_captions={3: 2, 5: 1}))


def _all(batches, epoch, start=0):
    return list(batches.epoch(epoch, start))


def test_epoch_covers_train_once_in_seeded_order(tiny):
    b = CaptionBatches(tiny, "train", batch_size=5, seed=7)
    assert len(b) == 5  # ceil(24 / 5)
    batches = _all(b, 0)
    seen = np.concatenate([x.index for x in batches])
    assert sorted(seen.tolist()) == list(range(24))
    assert [x.size for x in batches] == [5, 5, 5, 5, 4]
    # the order is the documented permutation, different per epoch, equal for equal seeds
    expected = np.arange(24)[np.random.default_rng([7, 0]).permutation(24)]
    np.testing.assert_array_equal(seen, expected)
    again = np.concatenate([x.index for x in _all(CaptionBatches(tiny, "train", batch_size=5, seed=7), 0)])
    np.testing.assert_array_equal(seen, again)
    other = np.concatenate([x.index for x in _all(b, 1)])
    assert not np.array_equal(seen, other)


def test_batch_contents_match_the_files(tiny):
    b = CaptionBatches(tiny, "train", batch_size=6, seed=1)
    x = b.load(2, 1)
    with h5py.File(tiny.path / "features.h5") as f:
        np.testing.assert_array_equal(x.att.numpy(), f["att"][:][x.index].astype(np.float32))
        np.testing.assert_array_equal(x.fc.numpy(), f["fc"][:][x.index].astype(np.float32))
    with h5py.File(tiny.path / "captions.h5") as f:
        labels, start = f["labels"][:], f["label_start"][:]
    assert x.labels.shape == (6, 5, 8) and x.labels.dtype == torch.int64
    for j, i in enumerate(x.index):
        if i not in (3, 5):  # exactly five captions: all of them, in order
            np.testing.assert_array_equal(x.labels[j].numpy(), labels[start[i]:start[i] + 5])
    assert x.att_mask is None and x.epoch == 2 and x.batch == 1 and x.weight == 1.0


def test_images_with_more_captions_get_a_seeded_choice(tiny):
    b = CaptionBatches(tiny, "train", batch_size=24, seed=3, shuffle=False)
    x1, x2 = b.load(0, 0), b.load(0, 0)
    np.testing.assert_array_equal(x1.labels.numpy(), x2.labels.numpy())
    assert x1.labels.shape == (24, 5, 8)
    with h5py.File(tiny.path / "captions.h5") as f:
        rows3 = {tuple(r) for r in f["labels"][f["label_start"][3]:f["label_end"][3]]}
    assert {tuple(r) for r in x1.labels[3].numpy()} <= rows3


def test_resume_position_gives_the_remaining_batches(tiny):
    b = CaptionBatches(tiny, "train", batch_size=5, seed=11)
    full = _all(b, 3)
    tail = _all(b, 3, start=2)
    assert len(tail) == 3
    for a, c in zip(full[2:], tail):
        np.testing.assert_array_equal(a.index, c.index)
        assert torch.equal(a.labels, c.labels) and torch.equal(a.att, c.att)
    assert _all(b, 3, start=5) == []


def test_workers_give_the_same_batches_and_leave_the_global_rng_alone(tiny):
    plain = _all(CaptionBatches(tiny, "train", batch_size=5, seed=2), 1, start=1)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    workers = _all(CaptionBatches(tiny, "train", batch_size=5, seed=2, num_workers=2), 1, start=1)
    assert torch.equal(before, torch.get_rng_state())
    assert len(plain) == len(workers) == 4
    for a, c in zip(plain, workers):
        np.testing.assert_array_equal(a.index, c.index)
        assert torch.equal(a.att, c.att) and torch.equal(a.labels, c.labels)


def test_ddp_shares_partition_each_global_batch(tiny):
    single = _all(CaptionBatches(tiny, "train", batch_size=7, seed=5), 0)
    shares = [_all(CaptionBatches(tiny, "train", batch_size=7, seed=5, rank=r, world_size=3), 0) for r in range(3)]
    assert len(single) == 4 and all(len(s) == 4 for s in shares)  # 24 = 7+7+7+3: the 3 still shares out
    for b, one in enumerate(single):
        parts = [s[b] for s in shares]
        np.testing.assert_array_equal(np.concatenate([p.index for p in parts]), one.index)
        assert torch.equal(torch.cat([p.labels for p in parts]), one.labels)
        assert sum(p.weight for p in parts) == pytest.approx(3.0)
    # a last batch smaller than the number of processes is dropped, for every rank alike
    four = CaptionBatches(tiny, "train", batch_size=11, seed=5, rank=0, world_size=3)
    assert len(four) == 2  # 24 = 11 + 11 + 2 and 2 < 3 processes


def test_reads_only_the_batch_rows(tiny, monkeypatch):
    from rdpp_cli.data.dataset import RowReader

    asked = []
    orig = RowReader.read

    def spy(self, idx, ds, out=None):
        asked.append((self.name, np.asarray(idx).copy()))
        return orig(self, idx, ds, out)

    monkeypatch.setattr(RowReader, "read", spy)
    b = CaptionBatches(tiny, "train", batch_size=4, seed=0)
    x = b.load(0, 2)
    att_reads = [i for name, i in asked if name == "/att"]
    assert len(att_reads) == 1 and sorted(att_reads[0].tolist()) == sorted(x.index.tolist())


def test_explicit_images_in_order(tiny):
    val = tiny.split_indices("val")
    b = CaptionBatches(tiny, images=val[1:6], batch_size=2, shuffle=False)
    got = np.concatenate([x.index for x in b.epoch(0)])
    np.testing.assert_array_equal(got, val[1:6])
