"""Training batches over a data artifact: seeded, resumable, shardable, reading only the batch's rows.

Every batch is a pure function of ``(seed, epoch, batch index)``:

- the epoch's order is ``permutation(epoch)``, drawn from ``np.random.default_rng([seed, epoch])``;
- global batch ``b`` is ``order[b * batch_size:(b + 1) * batch_size]`` (``batch_size`` counts the
  images of one optimizer step, *all processes together*);
- with ``world_size`` processes (DDP), rank ``r`` takes part ``r`` of ``np.array_split`` of that
  global batch, so N processes see exactly the (image, captions) pairs one process would;
- the captions of each image are ``seq_per_img`` of its rows (all of them when it has exactly that
  many, else a choice drawn from ``default_rng([seed, epoch, b])`` over the global batch).

So a run resumed at position ``(epoch, batch)`` sees exactly the batches an uninterrupted run would,
with or without read-ahead workers. Only the batch's rows are read from features.h5 (the caption
labels, ~40 MB for COCO, are read once): memory does not grow with the features.

``num_workers`` threads read the next batches while the training step runs. Threads, not
DataLoader processes: reading a batch is ``os.preadv`` system calls that release the GIL, and a
process would hand its 40 MB batch over through fresh shared memory, which cost more than the read
itself (docs/data.md, "The data path at COCO scale"). Features stay in the file's dtype (float16
by default) on the host — half the bytes to read and to copy to the GPU, where ``Batch.to`` makes
them float32. With ``pin_memory`` (a CUDA run) rows are read straight into page-locked memory, so
that copy is asynchronous.

**Resident features** (``resident="auto"``, ``--resident``): where every feature row of the
loader's images fits, they are read once, in file order, and each batch is gathered from memory —
on the GPU when they take at most ``DEVICE_SHARE`` of its free memory, else in page-locked host
memory (a CUDA run) or plain RAM (a CPU run) when they take at most ``HOST_SHARE`` of the available
RAM; otherwise, or with ``resident="off"``, batches are read from the file as above. The batches
are the same either way (the same rows, dtype and order), so residency is not part of a run's
identity and a resumed run may differ in it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from rdpp_cli.checks import RESIDENT_CHOICES
from rdpp_cli.data.dataset import DataArtifact, att_mask
from rdpp_cli.errors import RdppError


@dataclass
class Batch:
    """One process's share of one optimizer step."""

    index: np.ndarray  # (B,) image rows of the data artifact
    fc: Tensor  # (B, D): the file's dtype as loaded, float32 after .to(device)
    att: Tensor  # (B, R, D): likewise
    att_mask: Tensor | None  # (B, R) or None
    labels: Tensor  # (B, seq_per_img, L) int64 word ids, 0-padded
    epoch: int
    batch: int  # index of the batch within its epoch
    global_images: int  # images of the whole step, all processes together
    world_size: int = 1

    @property
    def size(self) -> int:
        return len(self.index)

    @property
    def weight(self) -> float:
        """Loss scale that turns DDP's mean of per-process means into the mean over the whole step
        (1.0 with one process or with equal shares)."""
        return self.size * self.world_size / self.global_images

    def to(self, device: torch.device | str) -> "Batch":
        """The batch on ``device`` with float32 features (converted there, after the copy)."""
        nb = torch.device(device).type == "cuda"
        return replace(
            self,
            fc=self.fc.to(device, non_blocking=nb).float(),
            att=self.att.to(device, non_blocking=nb).float(),
            att_mask=None if self.att_mask is None else self.att_mask.to(device, non_blocking=nb),
            labels=self.labels.to(device, non_blocking=nb),
        )


class CaptionBatches:
    """Seeded, resumable batches of (features, ``seq_per_img`` captions) over some images.

    ``split`` picks the images (train/val/test), or ``images`` gives their rows explicitly (e.g.
    one process's share of the validation images). ``shuffle=False`` keeps the given order.
    ``num_workers`` threads read ahead; ``pin_memory`` (for a CUDA run) reads batches into
    page-locked memory.
    """

    def __init__(
        self,
        data: DataArtifact,
        split: str = "train",
        *,
        batch_size: int,
        seq_per_img: int = 5,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        images: np.ndarray | None = None,
        pin_memory: bool = False,
        resident: str = "off",
        device: torch.device | str = "cpu",
    ):
        if batch_size < 1:
            raise RdppError(f"--batch-size must be at least 1 (got {batch_size})")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        self.data = data
        self.images = np.asarray(images, dtype=np.int64) if images is not None else data.split_indices(split)
        self.batch_size = batch_size
        self.seq_per_img = seq_per_img
        self.seed = seed
        self.shuffle = shuffle
        self.rank, self.world_size = rank, world_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        n = len(self.images)
        if n < world_size:
            raise RdppError(f"{n} images for {world_size} processes; every process needs at least one image")
        if batch_size < world_size:
            raise RdppError(f"--batch-size {batch_size} is smaller than the {world_size} processes; "
                            f"use at least {world_size} images per step")
        nb = -(-n // batch_size)
        if nb > 1 and n - (nb - 1) * batch_size < world_size:  # a last batch too small to share out
            nb -= 1
        self._num_batches = nb
        self.resident = ResidentFeatures.load(data, self.images, resident, torch.device(device))

    def __len__(self) -> int:
        """Batches (optimizer steps) per epoch."""
        return self._num_batches

    @property
    def images_per_epoch(self) -> int:
        return min(len(self.images), self._num_batches * self.batch_size)

    def permutation(self, epoch: int) -> np.ndarray:
        """The images of ``epoch`` in the order they are visited."""
        if not self.shuffle:
            return self.images
        return self.images[np.random.default_rng([self.seed, epoch]).permutation(len(self.images))]

    def global_batch(self, epoch: int, b: int, order: np.ndarray | None = None) -> np.ndarray:
        order = self.permutation(epoch) if order is None else order
        return order[b * self.batch_size:(b + 1) * self.batch_size]

    def load(self, epoch: int, b: int, order: np.ndarray | None = None) -> Batch:
        """Batch ``b`` of ``epoch`` (this process's share), read from disk."""
        if not 0 <= b < self._num_batches:
            raise IndexError(f"batch {b} outside 0..{self._num_batches - 1}")
        glob = self.global_batch(epoch, b, order)
        if self.seq_per_img:
            rng = np.random.default_rng([self.seed, epoch, b])
            labels_all = self.data.captions_per_image(glob, self.seq_per_img, rng)
        else:
            labels_all = np.zeros((len(glob), 0, self.data.seq_length), dtype=np.int64)
        parts = np.array_split(np.arange(len(glob)), self.world_size)[self.rank]
        idx = glob[parts]
        labels = torch.from_numpy(labels_all[parts])
        if self.resident is not None:
            fc, att, mask = self.resident.rows(idx)
            labels = labels.to(fc.device)
        elif self.pin_memory:  # read straight into page-locked memory: no copy before the GPU's
            d, dt = self.data, _TORCH_DTYPE[self.data.feature_dtype]
            fc = torch.empty((len(idx), d.fc_dim), dtype=dt, pin_memory=True)
            att = torch.empty((len(idx), d.att_regions, d.att_dim), dtype=dt, pin_memory=True)
            lens = d.feature_rows(idx, out=(fc.numpy(), att.numpy()))[2]
            mask = att_mask(lens, d.att_regions)
            labels, mask = labels.pin_memory(), None if mask is None else mask.pin_memory()
        else:
            fc, att, lens = self.data.feature_rows(idx)
            fc, att, mask = torch.from_numpy(fc), torch.from_numpy(att), att_mask(lens, att.shape[1])
        return Batch(index=idx, fc=fc, att=att, att_mask=mask, labels=labels, epoch=epoch, batch=b,
                     global_images=len(glob), world_size=self.world_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from batch ``start`` on (a resumed run passes its position)."""
        if start >= self._num_batches:
            return iter(())
        order = self.permutation(epoch)
        batches = range(start, self._num_batches)
        if self.num_workers <= 0:
            return (self.load(epoch, b, order) for b in batches)
        return read_ahead(lambda b: self.load(epoch, b, order), batches, self.num_workers)


_TORCH_DTYPE = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32}
DEVICE_SHARE = 0.75  # resident on the GPU when the features take at most this share of its free memory
HOST_SHARE = 0.5  # in host memory when they take at most this share of the available RAM


def available_ram() -> int:
    """Bytes of RAM available to a new allocation without swapping (``MemAvailable``; 0 if unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def residency(nbytes: int, device: torch.device) -> str | None:
    """Where ``nbytes`` of features are kept for a run on ``device``: "device" (the GPU, when they
    take at most ``DEVICE_SHARE`` of its free memory), "pinned" (page-locked host memory, a CUDA
    run) or "ram" (a CPU run) when they take at most ``HOST_SHARE`` of the available RAM; else None
    (read from the file per batch)."""
    if device.type == "cuda" and nbytes <= DEVICE_SHARE * torch.cuda.mem_get_info(device)[0]:
        return "device"
    if nbytes <= HOST_SHARE * available_ram():
        return "pinned" if device.type == "cuda" else "ram"
    return None


class ResidentFeatures:
    """The feature rows of some images held in memory (the file's dtype), gathered per batch."""

    def __init__(self, data: DataArtifact, images: np.ndarray, place: str, device: torch.device,
                 chunk: int = 1024):
        self.images = np.unique(images)  # sorted: read in file order
        self.place = place
        where = device if place == "device" else torch.device("cpu")
        n, dt = len(self.images), _TORCH_DTYPE[data.feature_dtype]
        pin = place == "pinned"
        self.fc = torch.empty((n, data.fc_dim), dtype=dt, device=where, pin_memory=pin)
        self.att = torch.empty((n, data.att_regions, data.att_dim), dtype=dt, device=where, pin_memory=pin)
        self.lens = None if not data.has_att_len else torch.empty(n, dtype=torch.long)
        for s in range(0, n, chunk):
            fc, att, lens = data.feature_rows(self.images[s:s + chunk])
            self.fc[s:s + chunk].copy_(torch.from_numpy(fc))
            self.att[s:s + chunk].copy_(torch.from_numpy(att))
            if self.lens is not None:
                self.lens[s:s + chunk] = torch.from_numpy(np.asarray(lens, dtype=np.int64))
        self.regions = data.att_regions

    @classmethod
    def load(cls, data: DataArtifact, images: np.ndarray, option: str, device: torch.device
             ) -> "ResidentFeatures | None":
        """The features of ``images`` in memory where ``option`` ("auto", "off") and ``residency`` allow."""
        if option not in RESIDENT_CHOICES:
            raise RdppError(f"--resident {option!r} is not a residency setting; use one of {', '.join(RESIDENT_CHOICES)}")
        if option == "off":
            return None
        n = len(np.unique(images))
        per_image = (data.fc_dim + data.att_regions * data.att_dim) * data.feature_dtype.itemsize
        place = residency(n * per_image, device)
        return None if place is None else cls(data, images, place, device)

    @property
    def nbytes(self) -> int:
        return self.fc.nbytes + self.att.nbytes

    def rows(self, idx: np.ndarray) -> tuple[Tensor, Tensor, Tensor | None]:
        """(fc, att, att_mask) of images ``idx`` (in that order, repeats allowed), where they are kept."""
        pos = torch.from_numpy(np.searchsorted(self.images, idx))
        mask = None if self.lens is None else att_mask(self.lens[pos].numpy(), self.regions)
        if self.place == "pinned":  # gathered straight into page-locked memory
            fc = torch.empty((len(pos), *self.fc.shape[1:]), dtype=self.fc.dtype, pin_memory=True)
            att = torch.empty((len(pos), *self.att.shape[1:]), dtype=self.att.dtype, pin_memory=True)
            torch.index_select(self.fc, 0, pos, out=fc)
            torch.index_select(self.att, 0, pos, out=att)
            return fc, att, None if mask is None else mask.pin_memory()
        pos = pos.to(self.fc.device)
        return self.fc[pos], self.att[pos], None if mask is None else mask.to(self.fc.device)


def read_ahead(load: Callable, items: Iterable, threads: int) -> Iterator:
    """``load(item)`` for each item, in order, computed by ``threads`` threads up to
    ``2 * threads`` items ahead of the consumer. An error in ``load`` is raised to the consumer at
    its item; a consumer that stops early (or is closed) cancels what was not started yet."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="rdpp-read-ahead")
    todo = iter(items)
    pending = deque(pool.submit(load, item) for item in itertools.islice(todo, 2 * threads))
    try:
        while pending:
            result = pending.popleft().result()
            for item in itertools.islice(todo, 1):
                pending.append(pool.submit(load, item))
            yield result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
