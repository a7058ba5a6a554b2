"""Self-CIDEr diversity of the m captions of an image (Wang & Chan, CVPR 2019; docs/metrics.md#self-cider).

From the m x m similarity kernel K of an image's captions, with singular values (or eigenvalues)
lambda_i: ``div = -log( sqrt(lambda_max) / sum_i sqrt(lambda_i) ) / log(m)``, in [0, 1] — 0 when
every caption is the same (K has rank one), 1 when no two captions share an n-gram (K diagonal
with equal entries).

Two variants, selected by name:

* ``"cider-d"`` (default): K_ij = CIDEr-D of caption i against the single reference j for
  i <= j, mirrored; lambda = singular values of K, as the authors' code (``np.linalg.svd``; for the
  mirrored, hence symmetric, K they are computed as the eigenvalues' magnitudes with ``eigvalsh``,
  equal to ``svd``'s to ~1e-15 and faster).
* ``"cider"``: the variant in common use (self-critical.pytorch's ``eval_multi``): plain CIDEr
  (tf-idf cosine, no clipping, no length penalty), K / 10, ``np.linalg.eigvalsh``, negative
  eigenvalues clipped to 0.

Decisions (docs/metrics.md#self-cider-variants-and-decisions): one caption (m = 1) has diversity
0 (the formula divides by log 1), and so has an all-zero kernel (every caption empty, or made only
of n-grams with zero idf). Singular values below numpy's ``matrix_rank`` tolerance
(``max * M * eps``) count as 0, so identical captions give exactly 0 rather than the ~1e-8 that
the square root makes of round-off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rdpp_cli.metrics.cider import CiderD, DocFreq

VARIANTS = ("cider-d", "cider")


def _check(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown self-CIDEr variant {variant!r}; use one of {', '.join(VARIANTS)}")


def self_cider_from_kernel(K: np.ndarray, variant: str = "cider-d") -> np.ndarray:
    """Self-CIDEr diversity (B,) from kernels K (B, M, M) (or one (M, M) kernel -> shape ())."""
    _check(variant)
    K = np.asarray(K, dtype=np.float64)
    single = K.ndim == 2
    if single:
        K = K[None]
    if K.ndim != 3 or K.shape[1] != K.shape[2]:
        raise ValueError(f"self-CIDEr needs square kernels (B, M, M), got shape {K.shape}")
    B, M, _ = K.shape
    out = np.zeros(B)
    if M > 1 and B:
        if variant == "cider-d":
            if np.array_equal(K, K.transpose(0, 2, 1)):
                # the singular values of a symmetric matrix are its eigenvalues' magnitudes:
                # eigvalsh gives np.linalg.svd's values (to ~1e-15) in 60% of the time
                lam = np.abs(np.linalg.eigvalsh(K))
            else:
                lam = np.linalg.svd(K, compute_uv=False)
            top = lam.max(1)
        else:
            lam = np.clip(np.linalg.eigvalsh(K / 10.0), 0.0, None)  # ascending
            top = lam[:, -1]
        # values below numpy's matrix_rank tolerance are round-off (a rank-one K of identical
        # captions leaves ~1e-15, whose square root would add ~1e-8 of fake diversity)
        lam = np.where(lam > top[:, None] * M * np.finfo(np.float64).eps, lam, 0.0)
        root = np.sqrt(lam).sum(1)
        ok = root > 0
        out[ok] = -np.log(np.sqrt(top[ok]) / root[ok]) / np.log(M)
    out = np.clip(out, 0.0, 1.0)  # rounding can leave -1e-17 for identical captions
    return out[0] if single else out


def self_cider_kernel(captions: Any, df: DocFreq | None = None, variant: str = "cider-d") -> np.ndarray:
    """The (B, M, M) kernel of ``variant`` for B images with M captions each (strings or ids)."""
    _check(variant)
    return CiderD(df).pairwise(captions, kind=variant)


def self_cider(captions: Any, df: DocFreq | None = None, variant: str = "cider-d") -> np.ndarray:
    """Self-CIDEr diversity (B,) of B images with M captions each.

    ``df``: fixed document frequencies (the definition's: the training set's ``cider_df.h5``); None uses the
    captions themselves (each image's M captions one document).
    """
    return self_cider_from_kernel(self_cider_kernel(captions, df, variant), variant)


def self_cider_ragged(captions: list[list[str]], df: DocFreq | None = None,
                      variant: str = "cider-d") -> np.ndarray:
    """Self-CIDEr of images whose caption counts differ (e.g. 5-7 human references): images are
    grouped by count and each group scored in one call. Returns (len(captions),)."""
    out = np.zeros(len(captions))
    counts = np.array([len(c) for c in captions])
    for m in np.unique(counts):
        idx = np.flatnonzero(counts == m)
        if m > 1:
            out[idx] = self_cider([captions[i] for i in idx], df, variant)
    return out
