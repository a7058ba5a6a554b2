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
with or without DataLoader workers. Only the batch's rows are read from the HDF5 files: memory does
not grow with the dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.errors import RdppError


@dataclass
class Batch:
    """One process's share of one optimizer step."""

    index: np.ndarray  # (B,) image rows of the data artifact
    fc: Tensor  # (B, D) float32
    att: Tensor  # (B, R, D) float32
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
        nb = torch.device(device).type == "cuda"
        return replace(
            self,
            fc=self.fc.to(device, non_blocking=nb),
            att=self.att.to(device, non_blocking=nb),
            att_mask=None if self.att_mask is None else self.att_mask.to(device, non_blocking=nb),
            labels=self.labels.to(device, non_blocking=nb),
        )


class CaptionBatches:
    """Seeded, resumable batches of (features, ``seq_per_img`` captions) over some images.

    ``split`` picks the images (train/val/test), or ``images`` gives their rows explicitly (e.g.
    one process's share of the validation images). ``shuffle=False`` keeps the given order.
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
        fc, att, mask = self.data.features(idx)
        return Batch(index=idx, fc=fc, att=att, att_mask=mask, labels=torch.from_numpy(labels_all[parts]),
                     epoch=epoch, batch=b, global_images=len(glob), world_size=self.world_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from batch ``start`` on (a resumed run passes its position)."""
        if start >= self._num_batches:
            return iter(())
        order = self.permutation(epoch)
        if self.num_workers <= 0:
            return (self.load(epoch, b, order) for b in range(start, self._num_batches))
        ds = _EpochDataset(self, epoch, start, order)
        # A private generator: DataLoader otherwise draws its workers' base seed from the global
        # torch RNG, which would make a resumed run's dropout differ from an uninterrupted one.
        loader = torch.utils.data.DataLoader(ds, batch_size=None, shuffle=False, num_workers=self.num_workers,
                                             generator=torch.Generator().manual_seed(self.seed),
                                             collate_fn=_identity)
        return iter(loader)


def _identity(x):
    return x


class _EpochDataset(torch.utils.data.Dataset):
    def __init__(self, batches: CaptionBatches, epoch: int, start: int, order: np.ndarray):
        self.batches, self.epoch, self.start, self.order = batches, epoch, start, order

    def __len__(self) -> int:
        return len(self.batches) - self.start

    def __getitem__(self, i: int) -> Batch:
        return self.batches.load(self.epoch, self.start + i, self.order)
