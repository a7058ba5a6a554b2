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

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.metrics.cider.torch_kernel import Grams, TorchCiderD
from rdpp_cli.metrics.train_cider import TrainCider

__all__ = ["DeviceTrainCider", "references_tensor", "self_cider_from_kernel", "with_eos"]


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


class DeviceTrainCider:
    """``TrainCider``'s ``score``, ``pairwise`` and ``score_and_pairwise`` on token-id tensors on
    ``device``, in float64."""

    def __init__(self, cider: TrainCider, device: torch.device | str) -> None:
        self.kernel = TorchCiderD(cider.df, device, sigma=cider.cider.sigma)
        self.eos, self.max_len, self.ref_len = cider.eos, cider.max_len, cider.ref_len
        if self.eos >= self.kernel.base:
            raise ValueError(f"the end token {self.eos} is not in the df's id range (base {self.kernel.base})")

    def score(self, hyps: Tensor, refs: Tensor, counts: Tensor, ref_index: Tensor | None = None) -> Tensor:
        """CIDEr-D (H,) of hypotheses (H, T) against reference sets (S, k, L) with ``counts`` (S,)."""
        return self.kernel.score(with_eos(hyps, self.max_len, self.eos), with_eos(refs, self.ref_len, self.eos),
                                 counts, ref_index)

    def pairwise(self, samples: Tensor, g: Grams | None = None) -> Tensor:
        """The R-DPP kernel S (B, M, M), published direction: ``S_ij`` = caption j scored against
        caption i for i <= j, mirrored (``TrainCider.pairwise``). ``g``: the samples' grams (with
        the end token), when the caller has them."""
        A = self.kernel.cross(with_eos(samples, self.max_len, self.eos), g)
        M = A.shape[-1]
        upper = torch.ones(M, M, dtype=torch.bool, device=A.device).triu()
        return torch.where(upper, A.transpose(1, 2), A)

    def score_and_pairwise(self, samples: Tensor, refs: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, M) of samples (B, M, T) against their image's references, and S (B, M, M), from one
        pass over the samples' n-grams (as ``TrainCider.score_and_pairwise``)."""
        B, M, T = samples.shape
        index = torch.arange(B, device=samples.device).repeat_interleave(M)
        g = self.kernel.grams(with_eos(samples, self.max_len, self.eos))  # (B, M, ...)
        flat = Grams(*(x.reshape(B * M, *x.shape[2:]) for x in g))
        q = self.kernel.score(samples.reshape(B * M, T), with_eos(refs, self.ref_len, self.eos), counts, index,
                              a=flat)
        return q.view(B, M), self.pairwise(samples, g)


def self_cider_from_kernel(K: Tensor) -> Tensor:
    """``self_cider.self_cider_from_kernel(K)`` (variant "cider-d") of symmetric kernels K (B, M, M):
    (B,) float64 on K's device. (One host synchronisation: ``eigvalsh`` checks its result.)"""
    K = K.to(torch.float64)
    B, M, _ = K.shape
    if M < 2:
        return K.new_zeros(B)
    lam = torch.linalg.eigvalsh(K).abs()
    top = lam.max(1).values
    lam = torch.where(lam > top.unsqueeze(1) * M * torch.finfo(torch.float64).eps, lam, 0.0)
    root = lam.sqrt().sum(1)
    div = -torch.log(top.sqrt() / torch.where(root > 0, root, 1.0)) / math.log(M)
    return torch.where(root > 0, div, 0.0).clamp(0.0, 1.0)
