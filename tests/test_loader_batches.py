"""The training batches are pinned: the feature reader (docs/data.md) yields exactly the recorded
batches — the same images, the same captions, in the same order for a seed — on every features.h5
layout, with and without workers, for every DDP share.

``EXPECTED`` was recorded from rdpp 0.1.0's loader (HDF5 fancy indexing, float32 in the batch; an
independent way of reading the same rows) on the artifact that ``write_indexed_data`` writes; every feature value and caption row
of that artifact says which image / which caption row it is, so the recorded image and caption-row
numbers pin every byte of the batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from rdpp_cli.artifacts import write_manifest
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.features import FeatureWriter
from rdpp_cli.data.loader import CaptionBatches

pytestmark = pytest.mark.unit

N_TRAIN, N_VAL, N_TEST = 24, 4, 2
N = N_TRAIN + N_VAL + N_TEST
R, D, L = 4, 6, 6
# captions per image: five for most, more or fewer for some (a seeded choice then picks five)
COUNTS = [5] * N
COUNTS[2], COUNTS[5], COUNTS[9], COUNTS[13], COUNTS[17] = 7, 6, 3, 1, 8


def att_of(i) -> np.ndarray:
    """Image i's att grid: i + r/8 + d/64 (exact in float16 for i < 32)."""
    i = np.asarray(i, dtype=np.float64)[..., None, None]
    return (i + np.arange(R)[:, None] / 8 + np.arange(D)[None, :] / 64).astype(np.float32)


def fc_of(i) -> np.ndarray:
    i = np.asarray(i, dtype=np.float64)[..., None]
    return (i + 0.5 + np.arange(D)[None, :] / 64).astype(np.float32)


def labels_of(row) -> np.ndarray:
    """Caption row j's labels: [j + 1, 1 + j % 5, 2, ...] then padding, so labels[..., 0] - 1 = j."""
    row = np.asarray(row, dtype=np.int64)
    out = np.zeros(row.shape + (L,), dtype=np.int64)
    out[..., 0] = row + 1
    out[..., 1] = 1 + row % 5
    out[..., 2] = np.where(row % 3 == 0, 0, 2)
    return out


def write_indexed_data(path: Path, layout: str = "writer") -> Path:
    """A data artifact whose features and captions name their image and caption row.

    ``layout``: ``writer`` (rdpp's FeatureWriter), ``contiguous`` (h5py's default for a whole
    array), ``gzip`` (compressed chunks of 4 rows: the reader's fallback path).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    ends = np.cumsum(COUNTS)
    starts = ends - np.array(COUNTS)
    rows = np.arange(int(ends[-1]))
    labels = labels_of(rows).astype(np.int32)
    vocab = [f"w{k}" for k in range(int(ends[-1]) + 1)] + ["UNK"]
    (path / "vocab.json").write_text(json.dumps({"words": vocab}))
    image_ids = np.arange(500, 500 + N, dtype=np.int64)
    with h5py.File(path / "captions.h5", "w") as f:
        f["labels"] = labels
        f["lengths"] = (labels > 0).sum(1).astype(np.int32)
        f["label_start"] = starts.astype(np.int64)
        f["label_end"] = ends.astype(np.int64)
        f["image_ids"] = image_ids
        f["split"] = np.array([b"train"] * N_TRAIN + [b"val"] * N_VAL + [b"test"] * N_TEST, dtype="S5")
        f.create_dataset("raw", data=np.array([f"caption {j}" for j in rows], dtype=object),
                         dtype=h5py.string_dtype())
    att, fc = att_of(np.arange(N)).astype(np.float16), fc_of(np.arange(N)).astype(np.float16)
    pre = {}
    if layout == "writer":
        w = FeatureWriter(path / "features.h5", image_ids, fc_dim=D, regions=R, block=8, attrs={"backbone": "indexed"})
        for s in range(0, N, 8):
            w.write(fc[s:s + 8], att[s:s + 8])
        pre = {"features.h5": w.finish()}
    else:
        kw = {"chunks": True, "compression": "gzip"} if layout == "gzip" else {}
        with h5py.File(path / "features.h5", "w") as f:
            f.create_dataset("fc", data=fc, **({**kw, "chunks": (4, D)} if kw else {}))
            f.create_dataset("att", data=att, **({**kw, "chunks": (4, R, D)} if kw else {}))
            f["image_ids"] = image_ids
    with h5py.File(path / "cider_df.h5", "w") as f:
        f["ngrams"] = np.zeros((0, 4), dtype=np.int32)
        f["df"] = np.zeros(0, dtype=np.float64)
        f.attrs["num_docs"] = N_TRAIN
    write_manifest(path, "rdpp.data", {"source": "indexed-test", "layout": layout}, precomputed=pre)
    return path


def describe(batches) -> list[list[list[int]]]:
    """Each batch as [image rows, caption rows of each image] (what EXPECTED records)."""
    out = []
    for b in batches:
        caps = (b.labels[..., 0] - 1).tolist() if b.labels.shape[1] else []
        out.append([b.index.tolist(), caps])
    return out


def record(data: DataArtifact, workers: int = 0) -> dict[str, list]:
    """The cases EXPECTED pins, computed with the loader as it is."""
    one = CaptionBatches(data, "train", batch_size=7, seed=4, num_workers=workers)
    cases = {f"epoch{e}": describe(one.epoch(e)) for e in (0, 1)}
    cases["epoch1_from2"] = describe(one.epoch(1, 2))
    for r in (0, 1):
        share = CaptionBatches(data, "train", batch_size=7, seed=4, rank=r, world_size=2, num_workers=workers)
        cases[f"epoch0_rank{r}of2"] = describe(share.epoch(0))
    three = CaptionBatches(data, "train", batch_size=5, seq_per_img=3, seed=9, num_workers=workers)
    cases["spi3_epoch2"] = describe(three.epoch(2))
    val = CaptionBatches(data, images=data.split_indices("val"), batch_size=3, shuffle=False, seq_per_img=0,
                         num_workers=workers)
    cases["val_in_order"] = describe(val.epoch(0))
    return cases


EXPECTED: dict[str, list] = {  # recorded with rdpp 0.1.0 by record(data) on write_indexed_data's artifact
    'epoch0': [
        [[0, 16, 20, 9, 11, 7, 8], [[0, 1, 2, 3, 4], [77, 78, 79, 80, 81], [100, 101, 102, 103, 104], [50, 50, 50, 49, 50], [56, 57, 58, 59, 60], [38, 39, 40, 41, 42], [43, 44, 45, 46, 47]]],
        [[13, 17, 10, 5, 22, 15, 1], [[66, 66, 66, 66, 66], [82, 83, 84, 87, 89], [51, 52, 53, 54, 55], [28, 29, 30, 31, 32], [110, 111, 112, 113, 114], [72, 73, 74, 75, 76], [5, 6, 7, 8, 9]]],
        [[18, 19, 2, 6, 23, 4, 3], [[90, 91, 92, 93, 94], [95, 96, 97, 98, 99], [10, 11, 14, 15, 16], [33, 34, 35, 36, 37], [115, 116, 117, 118, 119], [22, 23, 24, 25, 26], [17, 18, 19, 20, 21]]],
        [[12, 21, 14], [[61, 62, 63, 64, 65], [105, 106, 107, 108, 109], [67, 68, 69, 70, 71]]],
    ],
    'epoch1': [
        [[4, 9, 6, 14, 0, 12, 5], [[22, 23, 24, 25, 26], [49, 50, 48, 49, 50], [33, 34, 35, 36, 37], [67, 68, 69, 70, 71], [0, 1, 2, 3, 4], [61, 62, 63, 64, 65], [27, 28, 30, 31, 32]]],
        [[15, 11, 19, 7, 21, 16, 17], [[72, 73, 74, 75, 76], [56, 57, 58, 59, 60], [95, 96, 97, 98, 99], [38, 39, 40, 41, 42], [105, 106, 107, 108, 109], [77, 78, 79, 80, 81], [83, 84, 85, 88, 89]]],
        [[2, 22, 10, 1, 20, 13, 18], [[11, 13, 14, 15, 16], [110, 111, 112, 113, 114], [51, 52, 53, 54, 55], [5, 6, 7, 8, 9], [100, 101, 102, 103, 104], [66, 66, 66, 66, 66], [90, 91, 92, 93, 94]]],
        [[23, 3, 8], [[115, 116, 117, 118, 119], [17, 18, 19, 20, 21], [43, 44, 45, 46, 47]]],
    ],
    'epoch1_from2': [
        [[2, 22, 10, 1, 20, 13, 18], [[11, 13, 14, 15, 16], [110, 111, 112, 113, 114], [51, 52, 53, 54, 55], [5, 6, 7, 8, 9], [100, 101, 102, 103, 104], [66, 66, 66, 66, 66], [90, 91, 92, 93, 94]]],
        [[23, 3, 8], [[115, 116, 117, 118, 119], [17, 18, 19, 20, 21], [43, 44, 45, 46, 47]]],
    ],
    'epoch0_rank0of2': [
        [[0, 16, 20, 9], [[0, 1, 2, 3, 4], [77, 78, 79, 80, 81], [100, 101, 102, 103, 104], [50, 50, 50, 49, 50]]],
        [[13, 17, 10, 5], [[66, 66, 66, 66, 66], [82, 83, 84, 87, 89], [51, 52, 53, 54, 55], [28, 29, 30, 31, 32]]],
        [[18, 19, 2, 6], [[90, 91, 92, 93, 94], [95, 96, 97, 98, 99], [10, 11, 14, 15, 16], [33, 34, 35, 36, 37]]],
        [[12, 21], [[61, 62, 63, 64, 65], [105, 106, 107, 108, 109]]],
    ],
    'epoch0_rank1of2': [
        [[11, 7, 8], [[56, 57, 58, 59, 60], [38, 39, 40, 41, 42], [43, 44, 45, 46, 47]]],
        [[22, 15, 1], [[110, 111, 112, 113, 114], [72, 73, 74, 75, 76], [5, 6, 7, 8, 9]]],
        [[23, 4, 3], [[115, 116, 117, 118, 119], [22, 23, 24, 25, 26], [17, 18, 19, 20, 21]]],
        [[14], [[67, 68, 69, 70, 71]]],
    ],
    'spi3_epoch2': [
        [[18, 23, 16, 1, 5], [[90, 92, 93], [117, 118, 119], [77, 78, 79], [5, 7, 8], [27, 28, 32]]],
        [[10, 3, 7, 20, 21], [[52, 54, 55], [17, 20, 21], [39, 41, 42], [100, 101, 104], [107, 108, 109]]],
        [[0, 13, 17, 22, 4], [[1, 3, 4], [66, 66, 66], [84, 85, 88], [110, 111, 114], [24, 25, 26]]],
        [[14, 15, 6, 12, 9], [[68, 69, 71], [74, 75, 76], [35, 36, 37], [61, 63, 64], [48, 49, 50]]],
        [[11, 8, 2, 19], [[56, 57, 59], [43, 44, 46], [11, 12, 15], [96, 97, 99]]],
    ],
    'val_in_order': [
        [[24, 25, 26], []],
        [[27], []],
    ],
}


@pytest.fixture(scope="module", params=["writer", "contiguous", "gzip"])
def indexed(request, tmp_path_factory):
    return DataArtifact.open(write_indexed_data(tmp_path_factory.mktemp("indexed") / request.param, request.param))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_exactly_the_recorded_ones(indexed, workers):
    assert record(indexed, workers) == EXPECTED


def test_batch_bytes_follow_from_the_recorded_rows(indexed):
    """Every value of every batch (as the training step gets it: ``.to(device)``) is the one its
    image and caption rows hold; features are float32 there, whatever the file's dtype."""
    b = CaptionBatches(indexed, "train", batch_size=7, seed=4)
    seen = 0
    for raw, (images, caps) in zip(b.epoch(1), EXPECTED["epoch1"]):
        x = raw.to("cpu")
        assert x.att.dtype == x.fc.dtype == torch.float32 and x.labels.dtype == torch.int64
        np.testing.assert_array_equal(x.index, images)
        np.testing.assert_array_equal(x.att.numpy(), att_of(images))
        np.testing.assert_array_equal(x.fc.numpy(), fc_of(images))
        np.testing.assert_array_equal(x.labels.numpy(), labels_of(caps))
        seen += len(images)
    assert seen == N_TRAIN


def test_features_in_any_order_with_repeats(indexed):
    idx = np.array([7, 3, 3, 29, 0, 7, 15])
    fc, att, mask = indexed.features(idx)
    assert fc.dtype == att.dtype == torch.float32 and mask is None
    np.testing.assert_array_equal(att.numpy(), att_of(idx))
    np.testing.assert_array_equal(fc.numpy(), fc_of(idx))
    fc16, att16, lens = indexed.feature_rows(idx)
    assert att16.dtype == np.float16 and lens is None
    np.testing.assert_array_equal(att16.astype(np.float32), att_of(idx))


def test_rows_are_read_straight_from_the_file_where_they_are_extents(indexed, monkeypatch):
    """One ``os.preadv`` per row for rdpp's layout and for a contiguous dataset (no HDF5 call);
    compressed chunks go through h5py. Either way the values are the same."""
    import os

    layout = indexed.artifact.manifest["config"]["layout"]
    calls = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off, *flags: calls.append(off) or real(fd, bufs, off, *flags))
    idx = np.array([11, 2, 19])
    fc, att, _ = indexed.feature_rows(idx)
    np.testing.assert_array_equal(att.astype(np.float32), att_of(idx))
    direct = layout != "gzip"
    assert indexed._readers["att"].direct is direct and indexed._readers["fc"].direct is direct
    assert len(calls) == (2 * len(idx) if direct else 0)


def test_rows_missing_from_the_page_cache_are_announced_then_read(indexed, monkeypatch):
    """Cold rows (the non-blocking read finds nothing cached, or only part of a row) are asked for
    together with POSIX_FADV_WILLNEED, then read in full; repeats are copies."""
    import os

    indexed.feature_rows([0])
    if not indexed._readers["att"].direct:
        pytest.skip("compressed chunks are read through h5py")
    real = os.preadv
    tries = []

    def cold(fd, bufs, off, *flags):
        if flags:  # RWF_NOWAIT: nothing cached, or only the first half of a row (every other try)
            tries.append(off)
            if len(tries) % 2:
                raise BlockingIOError
            return real(fd, [bufs[0][:len(bufs[0]) // 2]], off)
        return real(fd, bufs, off)

    advised = []
    monkeypatch.setattr(os, "preadv", cold)
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, off, n, advice: advised.append(advice))
    idx = np.array([9, 3, 9, 21])
    fc, att, _ = indexed.feature_rows(idx)
    np.testing.assert_array_equal(att.astype(np.float32), att_of(idx))
    np.testing.assert_array_equal(fc.astype(np.float32), fc_of(idx))
    assert len(tries) == 2 * 3  # one non-blocking try per distinct row of fc and of att
    assert advised == [os.POSIX_FADV_WILLNEED] * 6


def test_feature_rows_fill_given_arrays(indexed):
    idx = np.array([4, 1])
    fc_out, att_out = np.zeros((2, D), np.float16), np.zeros((2, R, D), np.float16)
    fc, att, _ = indexed.feature_rows(idx, out=(fc_out, att_out))
    assert fc is fc_out and att is att_out
    np.testing.assert_array_equal(att_out.astype(np.float32), att_of(idx))
    with pytest.raises(ValueError, match="expected a C-contiguous"):
        indexed.feature_rows(idx, out=(fc_out, np.zeros((3, R, D), np.float16)))


def test_read_ahead_keeps_order_raises_in_place_and_stops_early():
    import threading

    from rdpp_cli.data.loader import read_ahead

    started = []

    def load(i):
        started.append(i)
        if i == 5:
            raise KeyError("row 5")
        return i * i, threading.current_thread().name

    it = read_ahead(load, range(10), 2)
    got = [next(it) for _ in range(5)]
    assert [g[0] for g in got] == [0, 1, 4, 9, 16]
    assert all(name.startswith("rdpp-read-ahead") for _, name in got)
    with pytest.raises(KeyError, match="row 5"):
        next(it)
    started.clear()
    it = read_ahead(load, range(100), 2)
    assert next(it)[0] == 0
    it.close()  # the consumer stops: what was not started is cancelled
    assert len(started) <= 6


@pytest.mark.cuda(reason="needs a CUDA GPU (page-locked memory)")
def test_pinned_batches_are_the_same_on_the_gpu(indexed):
    plain = list(CaptionBatches(indexed, "train", batch_size=7, seed=4).epoch(0))
    pinned = list(CaptionBatches(indexed, "train", batch_size=7, seed=4, num_workers=2, pin_memory=True).epoch(0))
    for a, b in zip(plain, pinned):
        assert b.att.is_pinned() and b.fc.is_pinned() and b.labels.is_pinned()
        g = b.to("cuda")
        assert g.att.dtype == torch.float32 and g.att.is_cuda
        assert torch.equal(g.att.cpu(), a.to("cpu").att) and torch.equal(g.labels.cpu(), a.labels)
