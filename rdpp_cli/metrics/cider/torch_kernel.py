"""CIDEr-D with fixed document frequencies as torch tensor operations: the scorer on the model's device.

Why a second implementation: RL fine-tuning scores every step's sampled captions. ``scorer.py``
(numpy) needs them on the host, so on a GPU every step would copy them over and wait; this module
computes the same numbers where the captions already are -- in float64, with no host
synchronisation and no data-dependent shape, on any device (CPU tensors too: that is how the tests
compare it with ``CiderD``, to 1e-9).

How: the captions of one training step are short (T ≲ 20 tokens), so instead of joining postings
(``postings.py``) every pair of positions is compared directly. For captions a (hypothesis) and b
(reference) and order n, with g_i the n-gram starting at position i of a:

    tf_a(i) = #{i' : g_i' = g_i in a},   r(i) = #{j : the n-gram at j of b = g_i}
    val_n   = Σ_i min(tf_a(i), r(i)) · r(i) · idf(g_i)² / tf_a(i)  /  (|a_n| |b_n|)
    |a_n|²  = Σ_i tf_a(i) · idf(g_i)²

(the 1/tf_a(i) turns the sum over positions into the sum over distinct n-grams of ``kernel.py``'s
formula, pycocoevalcap's ``min(h, r) · r · idf²``; a zero norm gives 0), times the length penalty
``exp(-(len_a - len_b)² / (2σ²))`` on bigram counts; the score is 10 × the mean over n = 1..4.
A caption against itself is read off its norms, as ``kernel.py`` does. The df table is the
``DocFreq``'s n-grams as sorted base-``base`` keys (``keys.tuples_to_keys``), looked up with
``torch.searchsorted``; vocabularies up to ``keys.MAX_BASE`` - 1 words (COCO's has 9,487).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.metrics.cider import SIGMA, DocFreq
from rdpp_cli.metrics.cider.keys import MAX_BASE, N_ORDER, tuples_to_keys


class Grams(NamedTuple):
    """The n-grams of N captions, by start position: everything (..., 4, T) but the last two."""

    keys: Tensor  # int64 key of the n-gram of order n + 1 starting at each position
    ok: Tensor  # bool: that n-gram exists (all its words before the caption's end)
    tf: Tensor  # float64: how often it occurs in its caption (0 where it does not exist)
    idf2: Tensor  # float64: its idf squared (0 where it does not exist)
    norm: Tensor  # (..., 4) float64: |vector| of each order
    blen: Tensor  # (...,) float64: bigrams of the caption (words - 1, at least 0), the length penalty's length


def gram_keys(caps: Tensor, base: int) -> tuple[Tensor, Tensor]:
    """Keys (N, 4, T) of the n-grams of order 1..4 starting at each position of ``caps`` (N, T)
    (word ids, a caption ends at its first 0), ``t1 · base^(n-1) + ... + tn`` as ``keys.py``
    writes them, and whether each exists (N, 4, T)."""
    caps = caps.long() * (caps > 0).cumprod(-1)  # nothing after a caption's first 0
    key = torch.zeros_like(caps)
    ok = torch.ones_like(caps, dtype=torch.bool)
    keys, oks = [], []
    for n in range(N_ORDER):
        word = F.pad(caps[:, n:], (0, n))  # the (n+1)-th word of the n-gram starting at each position
        key = key * base + word
        ok = ok & (word > 0)
        keys.append(key)
        oks.append(ok)
    return torch.stack(keys, 1), torch.stack(oks, 1)


def _matches(a_keys: Tensor, b_keys: Tensor, b_ok: Tensor) -> Tensor:
    """How often the n-gram at each position of a (..., 4, T) occurs in b (..., 4, T'): float64."""
    eq = (a_keys.unsqueeze(-1) == b_keys.unsqueeze(-2)) & b_ok.unsqueeze(-2)
    return eq.sum(-1, dtype=torch.float64)


class TorchCiderD:
    """CIDEr-D under fixed document frequencies (a :class:`DocFreq`) on token-id tensors of any
    device: ``CiderD(df).score`` and ``.pairwise`` to ~1e-15, in float64. Captions' ids must be
    below ``df.base`` (the vocabulary and the training end token are)."""

    def __init__(self, df: DocFreq, device: torch.device | str = "cpu", sigma: float = SIGMA) -> None:
        if df.base > MAX_BASE:
            raise ValueError(f"TorchCiderD: vocabularies above {MAX_BASE - 1:,} words are not supported "
                             "(use CiderD, the numpy scorer)")
        keys = tuples_to_keys(df.ngrams, df.base)
        order = np.argsort(keys, kind="stable")
        self.keys = torch.from_numpy(keys[order]).to(device)
        self.log_df = torch.from_numpy(np.log(np.maximum(df.df[order], 1.0))).to(device)
        self.ref_len, self.base, self.sigma = df.ref_len, df.base, float(sigma)
        self.device = torch.device(device)

    def idf(self, keys: Tensor) -> Tensor:
        """``log(num_docs) - log(max(1, df))`` of each key (float64, same shape)."""
        if not len(self.keys):
            return torch.full(keys.shape, self.ref_len, dtype=torch.float64, device=keys.device)
        at = torch.searchsorted(self.keys, keys.reshape(-1)).clamp_(max=len(self.keys) - 1)
        found = self.keys[at] == keys.reshape(-1)
        return (self.ref_len - torch.where(found, self.log_df[at], 0.0)).view(keys.shape)

    def grams(self, caps: Tensor) -> Grams:
        """Everything the formula needs of captions ``caps`` (..., T)."""
        shape = caps.shape[:-1]
        keys, ok = gram_keys(caps.reshape(-1, caps.shape[-1]), self.base)
        tf = _matches(keys, keys, ok) * ok
        idf2 = torch.where(ok, self.idf(keys) ** 2, 0.0)
        norm = (tf * idf2).sum(-1).sqrt()
        blen = (ok[:, 0].sum(-1) - 1).clamp(min=0).to(torch.float64)
        return Grams(*(x.view(*shape, *x.shape[1:]) for x in (keys, ok, tf, idf2, norm, blen)))

    def pair(self, a: Grams, b: Grams) -> Tensor:
        """CIDEr-D of hypotheses ``a`` against single references ``b`` (batch shapes broadcast)."""
        r = _matches(a.keys, b.keys, b.ok)
        num = (torch.minimum(a.tf, r) * r * a.idf2 / a.tf.clamp(min=1.0)).sum(-1)  # (..., 4)
        den = a.norm * b.norm
        val = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
        d = a.blen - b.blen
        return val.sum(-1) * torch.exp(-(d * d) / (2 * self.sigma ** 2)) * (10.0 / N_ORDER)

    def score(self, hyps: Tensor, refs: Tensor, ref_counts: Tensor, ref_index: Tensor | None = None,
              a: Grams | None = None) -> Tensor:
        """CIDEr-D (H,) of each hypothesis (H, T) against its reference set: ``refs`` (S, k, T')
        holds S sets of up to k references, ``ref_counts`` (S,) how many of each are real (≥ 1),
        ``ref_index`` (H,) the set of each hypothesis (None: hypothesis h uses set h). ``a``: the
        hypotheses' ``grams``, when the caller has them."""
        idx = torch.arange(len(hyps), device=hyps.device) if ref_index is None else ref_index
        a, b = self.grams(hyps) if a is None else a, self.grams(refs)
        b = Grams(*(x[idx] for x in b))  # (H, k, ...)
        s = self.pair(Grams(*(x.unsqueeze(1) for x in a)), b)  # (H, k)
        real = torch.arange(refs.shape[1], device=hyps.device) < ref_counts[idx].unsqueeze(1)
        return (s * real).sum(1) / ref_counts[idx].to(torch.float64)

    def cross(self, caps: Tensor, g: Grams | None = None) -> Tensor:
        """``A[b, i, j]``: CIDEr-D of caption i of image b against caption j as its single
        reference, for the M captions (B, M, T) of each image; the diagonal exactly 10/4 × the
        orders of non-zero norm, as ``kernel.pair_scores`` has it. ``g``: ``grams(caps)``, when the
        caller has them."""
        g = self.grams(caps) if g is None else g
        A = self.pair(Grams(*(x.unsqueeze(2) for x in g)), Grams(*(x.unsqueeze(1) for x in g)))
        diag = (g.norm > 0).sum(-1).to(torch.float64) * (10.0 / N_ORDER)  # (B, M)
        return torch.diagonal_scatter(A, diag, dim1=1, dim2=2)

    def pairwise(self, caps: Tensor) -> Tensor:
        """``CiderD.pairwise(caps)`` (kind "cider-d"): caption i against reference j for i <= j,
        mirrored: (B, M, M)."""
        A = self.cross(caps)
        M = A.shape[-1]
        upper = torch.ones(M, M, dtype=torch.bool, device=A.device).triu()
        return torch.where(upper, A, A.transpose(1, 2))
