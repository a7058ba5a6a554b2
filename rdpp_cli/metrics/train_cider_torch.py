"""The training reward (``train_cider.TrainCider``) and self-CIDEr as torch tensor operations.

Why: the RL step's reward, computed where the model is (a GPU), so that its captions never travel
to the host (``rdpp finetune --fast on``; docs/training.md, "The fast path"). The numbers are the
numpy path's to ~1e-15, float64 throughout: the same end-token rule as ``train_cider.with_eos``,
the same published direction of the R-DPP kernel, the same CIDEr-D
(``metrics.cider.torch_kernel.TorchCiderD``) and the same self-CIDEr as
``self_cider.self_cider_from_kernel`` (variant "cider-d", symmetric kernels).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.metrics.cider.torch_kernel import Grams, TorchCiderD
from rdpp_cli.metrics.eigh import eigh
from rdpp_cli.metrics.train_cider import TrainCider

__all__ = ["DeviceTrainCider", "ReferenceTable", "device_scorer", "reference_table", "references_tensor",
           "self_cider_from_kernel", "with_eos"]

_TABLES: "weakref.WeakKeyDictionary[Any, dict[str, ReferenceTable]]" = weakref.WeakKeyDictionary()
_SCORERS: "weakref.WeakKeyDictionary[Any, dict[str, DeviceTrainCider]]" = weakref.WeakKeyDictionary()


def with_eos(tokens: Tensor, max_len: int, eos: int) -> Tensor:
    """``train_cider.with_eos`` on a tensor: (..., T) 0-padded ids -> (..., T + 1) int64 with
    ``eos`` right after every caption of fewer than ``max_len`` words."""
    tokens = tokens.long()
    n = (tokens > 0).long().cumprod(-1).sum(-1, keepdim=True)  # words before the first 0
    pos = torch.arange(tokens.shape[-1], device=tokens.device)
    out = F.pad(torch.where(pos < n, tokens, 0), (0, 1))
    return out.scatter(-1, n, (n < max_len).long() * eos)  # position n is 0 where no EOS goes


def references_tensor(refs: list[np.ndarray], device: torch.device | str) -> tuple[Tensor, Tensor]:
    """Reference sets (a list of (k_b, L) id arrays, ``DataArtifact.references_ids``) as one
    0-padded (B, max k, L) int64 tensor and the counts (B,), on ``device`` (copied from pinned
    memory without waiting, on a GPU)."""
    k = max(len(r) for r in refs)
    L = max(r.shape[1] for r in refs)
    out = np.zeros((len(refs), k, L), np.int64)
    for b, r in enumerate(refs):
        out[b, :len(r), :r.shape[1]] = r
    counts = np.array([len(r) for r in refs], np.int64)
    cuda = torch.device(device).type == "cuda"

    def move(a: np.ndarray) -> Tensor:
        t = torch.from_numpy(a)
        return t.pin_memory().to(device, non_blocking=True) if cuda else t.to(device)

    return move(out), move(counts)


class ReferenceTable:
    """Every image's encoded references as one 0-padded (images, max k, L) int32 tensor and the
    counts (images,), on a device: built once per data artifact (one read of ``captions.h5``'s
    labels; COCO: 123k images × 7 × 16, 55 MB), then a batch's references are one gather on the
    device (``take``) instead of an HDF5 read per image and a copy per step."""

    def __init__(self, refs: Tensor, counts: Tensor) -> None:
        self.refs, self.counts = refs, counts

    @classmethod
    def for_data(cls, data, device: torch.device | str) -> "ReferenceTable":
        """The table of a ``DataArtifact`` (its ``references_ids`` for every image) on ``device``."""
        labels = data._all_labels()
        start, end = np.asarray(data.label_start, np.int64), np.asarray(data.label_end, np.int64)
        k = int((end - start).max()) if len(start) else 1
        rows = start[:, None] + np.arange(k)
        real = rows < end[:, None]
        table = np.where(real[..., None], labels[np.minimum(rows, len(labels) - 1)], 0).astype(np.int32)
        return cls(torch.from_numpy(table).to(device), torch.from_numpy(end - start).to(device))

    def take(self, index) -> tuple[Tensor, Tensor]:
        """The references (B, max k, L) int64 and counts (B,) of images ``index`` (rows of the data
        artifact, a numpy array or a tensor), gathered on the table's device (a host index is copied
        from pinned memory without waiting, on a GPU)."""
        if not isinstance(index, Tensor):
            index = torch.from_numpy(np.asarray(index, np.int64))
        if index.device != self.refs.device:
            cuda = self.refs.device.type == "cuda"
            index = (index.pin_memory() if cuda else index).to(self.refs.device, non_blocking=cuda)
        return self.refs[index].long(), self.counts[index]


def reference_table(data, device: torch.device | str) -> ReferenceTable:
    """``ReferenceTable.for_data(data, device)``, built once per data artifact object and device."""
    per = _TABLES.setdefault(data, {})
    key = str(torch.device(device))
    if key not in per:
        per[key] = ReferenceTable.for_data(data, device)
    return per[key]


def device_scorer(cider: TrainCider, device: torch.device | str) -> "DeviceTrainCider":
    """``DeviceTrainCider(cider, device)``, built once per reward object and device (ValueError
    where the df's ids are out of the device scorer's range)."""
    per = _SCORERS.setdefault(cider, {})
    key = str(torch.device(device))
    if key not in per:
        per[key] = DeviceTrainCider(cider, device)
    return per[key]


class DeviceTrainCider:
    """``TrainCider``'s ``score``, ``pairwise`` and ``score_and_pairwise`` on token-id tensors on
    ``device``, in float64: the RL reward's scoring backend where the captions are (the methods of
    ``train_cider.NumpyScoring``; ``refs`` as ``(refs, counts)`` tensors, ``ReferenceTable.take``).
    Nothing here waits for the device, so it compiles into one graph (``fullgraph``)."""

    def __init__(self, cider: TrainCider, device: torch.device | str) -> None:
        self.kernel = TorchCiderD(cider.df, device, sigma=cider.cider.sigma)
        self.eos, self.max_len, self.ref_len = cider.eos, cider.max_len, cider.ref_len
        if self.eos >= self.kernel.base:
            raise ValueError(f"the end token {self.eos} is not in the df's id range (base {self.kernel.base})")

    @staticmethod
    def pad(x: Tensor, T: int) -> Tensor:
        """Token rows (..., T') 0-padded to width T."""
        return x if x.shape[-1] >= T else F.pad(x, (0, T - x.shape[-1]))

    def score(self, hyps: Tensor, refs: Tensor | tuple[Tensor, Tensor], counts: Tensor | None = None,
              ref_index: Tensor | None = None) -> Tensor:
        """CIDEr-D (H,) of hypotheses (H, T) against reference sets (S, k, L) with ``counts`` (S,)
        (or ``refs`` the pair, ``counts`` then ``ref_index``)."""
        if isinstance(refs, tuple):
            (refs, real), ref_index = refs, counts
            counts = real
        return self.kernel.score(with_eos(hyps, self.max_len, self.eos), with_eos(refs, self.ref_len, self.eos),
                                 counts, ref_index)

    @staticmethod
    def sample_mean(q: Tensor) -> Tensor:
        """The mean (B,) of each image's scores q (B, M)."""
        return q.mean(1)

    def self_cider(self, K: Tensor) -> Tensor:
        """The self-CIDEr (B,) of kernels K (B, M, M), without a host synchronisation off a CPU."""
        return self_cider_from_kernel(K)

    def pairwise(self, samples: Tensor, g: Grams | None = None) -> Tensor:
        """The R-DPP kernel S (B, M, M), published direction: ``S_ij`` = caption j scored against
        caption i for i <= j, mirrored (``TrainCider.pairwise``). ``g``: the samples' grams (with
        the end token), when the caller has them."""
        A = self.kernel.cross(with_eos(samples, self.max_len, self.eos), g)
        M = A.shape[-1]
        upper = torch.ones(M, M, dtype=torch.bool, device=A.device).triu()
        return torch.where(upper, A.transpose(1, 2), A)

    def score_and_pairwise(self, samples: Tensor, refs: Tensor | tuple[Tensor, Tensor], counts: Tensor | None = None
                           ) -> tuple[Tensor, Tensor]:
        """q (B, M) of samples (B, M, T) against their image's references (``refs``, ``counts``, or
        the pair as ``refs``), and S (B, M, M), from one pass over the samples' n-grams (as
        ``TrainCider.score_and_pairwise``)."""
        if isinstance(refs, tuple):
            refs, counts = refs
        B, M, T = samples.shape
        index = torch.arange(B, device=samples.device).repeat_interleave(M)
        g = self.kernel.grams(with_eos(samples, self.max_len, self.eos))  # (B, M, ...)
        flat = Grams(*(x.reshape(B * M, *x.shape[2:]) for x in g))
        q = self.kernel.score(samples.reshape(B * M, T), with_eos(refs, self.ref_len, self.eos), counts, index,
                              a=flat)
        return q.view(B, M), self.pairwise(samples, g)


def self_cider_from_kernel(K: Tensor, sync_free: bool | None = None) -> Tensor:
    """``self_cider.self_cider_from_kernel(K)`` (variant "cider-d") of symmetric kernels K (B, M, M):
    (B,) float64 on K's device. The eigenvalues by ``eigvalsh`` (which checks its result on the
    host: a device synchronisation), or with ``sync_free`` (None: off a CPU or under
    ``torch.compile``) by Jacobi rotations (``metrics.eigh``: no synchronisation, compilable; the
    same to ~1e-15 of the largest eigenvalue)."""
    K = K.to(torch.float64)
    B, M, _ = K.shape
    if M < 2:
        return K.new_zeros(B)
    if sync_free is None:
        sync_free = K.device.type != "cpu" or torch.compiler.is_compiling()
    lam = (eigh(K)[0] if sync_free else torch.linalg.eigvalsh(K)).abs()
    top = lam.max(1).values
    lam = torch.where(lam > top.unsqueeze(1) * M * torch.finfo(torch.float64).eps, lam, 0.0)
    root = lam.sqrt().sum(1)
    div = -torch.log(top.sqrt() / torch.where(root > 0, root, 1.0)) / math.log(M)
    return torch.where(root > 0, div, 0.0).clamp(0.0, 1.0)
