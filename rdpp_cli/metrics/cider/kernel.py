"""The CIDEr-D formula on postings: the scores of every pair of captions within each row.

Why a file of its own: this is the part a reader checks against the paper and coco-caption; it
needs nothing but postings (``postings.py``) and the idf of each n-gram (however that was found).

The formula (docs/metrics.md#cider-d, pycocoevalcap's ``CiderScorer``): a caption's vector holds, for each
n-gram g of order n, ``tf(g) * idf(g)``; between a hypothesis h and a reference r,
``val_n = sum_g min(h_g, r_g) * r_g / (|h_n| |r_n|)`` (the raw sum, 0, when a norm is 0), times
``exp(-(len_h - len_r)^2 / (2 sigma^2))`` with ``len`` the number of bigrams (tokens - 1, 0 for an
empty caption); the pair's score is 10 x the mean of ``val_n`` over n = 1..4.

How: with ``v = tf * idf / |vector|`` per posting, ``val_n = sum over shared n-grams of
v_h * v_r * min(1, r / h)``. Each hypothesis posting pairs with the contiguous range of postings
of the same n-gram in its row, and one ``bincount`` adds the pairs into (hypothesis, partner)
bins, so only n-grams two captions share are ever touched. A caption against itself is read off
its norms (``sum v^2 = 1`` over each order with a non-zero norm). Results equal pycocoevalcap to
~1e-15: only the order of floating-point additions differs.
"""

from __future__ import annotations

import numpy as np

from rdpp_cli.metrics.cider.keys import N_ORDER
from rdpp_cli.metrics.cider.postings import Postings


def pair_scores(post: Postings, gram_idf: np.ndarray, lens: np.ndarray, S: int, k: int, sigma: float,
                 clipped: bool, vs_refs: bool, vs_self: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Pair scores within each row of captions: 10 * mean over n of val_n [* length penalty].

    ``post``: the postings of G rows of S slots; ``gram_idf``: the idf of each of its gram groups;
    ``lens`` (G, S): the number of words of each slot's caption. Slots ``< k`` of a row hold
    references, the others (m = S - k) hypotheses. Returns ``(to_refs, to_self)``: (G, m, k)
    scores of each hypothesis against each reference (if ``vs_refs``) and (G, m, m) of hypothesis
    i against hypothesis j for i <= j (if ``vs_self``; zero below the diagonal).

    The join: the postings of one n-gram in one row are adjacent, ordered by slot (references
    first), so each hypothesis posting pairs with a contiguous range of postings, and only
    n-grams that two captions share are ever touched.
    """
    G = lens.shape[0]
    m = S - k
    n_ref, n_self = (G * m * k if vs_refs else 0), (G * m * m if vs_self else 0)
    acc = np.zeros(n_ref + n_self)
    diag = None
    if post.count.size:
        pcount, pslot, prow, gid, gstart = post.count, post.slot, post.row, post.gram, post.gram_start
        P = len(pcount)
        cw = pcount * gram_idf[gid]  # each posting's vector entry tf * idf
        cell = prow * S + pslot
        nrm = np.sqrt(np.bincount(cell, weights=cw * cw, minlength=G * N_ORDER * S))
        den = nrm[cell]
        v = cw / np.where(den != 0, den, 1.0)  # the entry of the normalised vector
        # val_n = sum over shared n-grams of min(h, r) * r * idf^2 / (|h| |r|) = v_h * v_r * min(1, r / h)
        multi = pcount > 1
        any_multi = clipped and bool(multi.any())
        hyp = np.flatnonzero(pslot >= k) if k else np.arange(P)
        hgid, hslot = gid[hyp], pslot[hyp] - k
        hrow = (prow[hyp] // N_ORDER) * m + hslot
        parts = []  # (partner range start, length, bin of the hypothesis row, bin offset of the partner)
        if vs_refs:
            rcount = np.bincount(gid[pslot < k], minlength=len(gstart)) if k else np.zeros(len(gstart), np.int64)
            parts.append((gstart[hgid], rcount[hgid], hrow * k, pslot))
        if vs_self:
            # a caption against itself: sum of v^2 over an order is 1 where its norm is not 0
            diag = (nrm.reshape(G, N_ORDER, S)[:, :, k:] > 0).sum(1)
            gend = np.append(gstart[1:], P)
            parts.append((hyp + 1, gend[hgid] - hyp - 1, n_ref + hrow * m, pslot - k))
        for lo, ln, rowbin, colbin in parts:
            tot = int(ln.sum())
            if tot == 0:
                continue
            ai = np.repeat(hyp, ln)
            bi = np.repeat(lo - (np.cumsum(ln) - ln), ln) + np.arange(tot)
            val = v[ai] * v[bi]
            if any_multi:
                fix = np.flatnonzero(multi[ai] | multi[bi])
                ca, cb = pcount[ai[fix]], pcount[bi[fix]]
                val[fix] *= np.minimum(ca, cb) / ca
            acc += np.bincount(np.repeat(rowbin, ln) + colbin[bi], weights=val, minlength=n_ref + n_self)
    to_refs = acc[:n_ref].reshape(G, m, k) * (10.0 / N_ORDER) if vs_refs else None
    to_self = acc[n_ref:].reshape(G, m, m) * (10.0 / N_ORDER) if vs_self else None
    if diag is not None:
        i = np.arange(m)
        to_self[:, i, i] = diag * (10.0 / N_ORDER)
    if clipped:
        blen = np.maximum(lens - 1, 0).astype(np.float64)  # coco-caption's length: the number of bigrams
        bh = blen[:, k:]
        if vs_refs:
            d = bh[:, :, None] - blen[:, None, :k]
            to_refs *= np.exp(-(d * d) / (2 * sigma ** 2))
        if vs_self:
            d = bh[:, :, None] - bh[:, None, :]
            to_self *= np.exp(-(d * d) / (2 * sigma ** 2))
    return to_refs, to_self

