"""CIDEr-D (coco-caption's ``Cider``): the public scorer, for evaluation and for the training reward.

Why: one implementation serves ``rdpp score`` (corpus document frequencies, like
``pycocoevalcap.cider.Cider``), validation and the RL rewards (fixed document frequencies, a
:class:`~rdpp_cli.metrics.cider.docfreq.DocFreq`), on strings or token ids, fast enough to run at
every training step.

This file only arranges the work: which captions are compared with which (groups of slots:
references first, then hypotheses), where the idf comes from, and how pair scores become the
returned arrays. The formula is in ``kernel.py``; the n-gram join in ``postings.py``; the df table
in ``docfreq.py`` and ``hashtable.py``; none of them need reading to follow this one.

What it guarantees: scores equal pycocoevalcap's to ~1e-15 (tests require 1e-9) in both modes;
``score_and_pairwise`` equals ``score`` plus ``pairwise`` on the same inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rdpp_cli.metrics.cider.captions import Caps, WordTable, caps_from, concat, has_strings, sets_from, to_numpy
from rdpp_cli.metrics.cider.docfreq import DocFreq
from rdpp_cli.metrics.cider.kernel import pair_scores
from rdpp_cli.metrics.cider.keys import MAX_BASE, N_ORDER, keys_to_digits, pair_keys
from rdpp_cli.metrics.cider.postings import build_postings, group_chunks, layout

SIGMA = 6.0  # the length penalty's sigma (coco-caption's)


class CiderD:
    """CIDEr-D with corpus document frequencies (``df=None``: from the references being scored,
    like ``pycocoevalcap.cider.Cider``) or fixed ones (a :class:`DocFreq`, e.g. the training set's
    ``cider_df.h5``, as the training reward needs).
    """

    def __init__(self, df: DocFreq | None = None, sigma: float = SIGMA) -> None:
        self.df = df
        self.sigma = float(sigma)

    def __repr__(self) -> str:
        return f"CiderD(df={self.df!r}, sigma={self.sigma})"

    # ---- helpers ------------------------------------------------------------------------

    def _table(self, strings: bool) -> WordTable | None:
        if not strings:
            return None
        if self.df is None:
            return WordTable()
        if self.df.words is None:
            raise TypeError("this DocFreq has no word list: pass token ids, or build it with words "
                            "(DocFreq.from_h5 next to vocab.json, or from_references on strings)")
        return WordTable(self.df.words, base=self.df.base)

    def _base(self, *caps: Caps, table: WordTable | None) -> int:
        base = max([c.max_id() + 1 for c in caps] + [table.next if table is not None else 0, 2])
        return max(base, self.df.base) if self.df is not None else base

    def _run(self, caps: Caps, slot_index: np.ndarray, k: int, base: int, *, doc_slots: int,
             doc_groups: np.ndarray | None, num_docs: int, clipped: bool, vs_refs: bool, vs_self: bool):
        """Score the rows of ``slot_index`` chunk by chunk; yields ``(rows, to_refs, to_self)``.

        Corpus mode (no fixed df): a first pass collects every chunk's postings, and the document
        frequency of an n-gram is the number of documents -- rows in ``doc_groups`` (None: all),
        counting slots ``< doc_slots`` -- that contain it; ``num_docs`` documents in all.
        """
        S = slot_index.shape[1]
        cap_lens = np.append(caps.word_counts(), 0)  # index -1 (an empty slot) -> 0 words
        chunks = []
        for rows in group_chunks(caps, slot_index):
            flat, slot, _ = layout(caps, slot_index[rows])
            post = build_postings(flat, slot, S, base)
            lens = cap_lens[slot_index[rows]]
            if self.df is not None:
                idf = self.df.ref_len - self.df._log_df_of_keys(post.gram_key, post.base, post.relabel)
                yield (rows, *pair_scores(post, idf, lens, S, k, self.sigma, clipped, vs_refs, vs_self))
            else:
                chunks.append((rows, post, lens))
        if self.df is not None:
            return
        # corpus document frequencies, from the postings themselves
        keys, flags = [], []
        for rows, post, _ in chunks:
            in_doc = np.zeros(len(post.gram_key), bool)
            if post.count.size:
                sel = post.slot < doc_slots
                if doc_groups is not None:
                    sel &= doc_groups[rows][post.row // N_ORDER]
                in_doc[post.gram[sel]] = True
            key = post.gram_key
            if post.relabel is not None or base > MAX_BASE:  # canonical two-word keys of original ids
                d = keys_to_digits(key, post.base)
                d = post.relabel[d] if post.relabel is not None else d
                key = pair_keys(d)
            keys.append(key)
            flags.append(in_doc)
        allk = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        if allk.ndim == 2 or (keys and any(k_.ndim == 2 for k_ in keys)):
            allk = np.concatenate([k_ if k_.ndim == 2 else np.stack([k_, k_], 1) for k_ in keys])
            _, inv = np.unique(allk, axis=0, return_inverse=True)
        else:
            _, inv = np.unique(allk, return_inverse=True)
        inv = inv.reshape(-1)
        df = np.bincount(inv, weights=np.concatenate(flags) if flags else None, minlength=int(inv.max(initial=-1)) + 1)
        ref_len = np.log(float(num_docs))
        idf_all = ref_len - np.log(np.maximum(df[inv], 1.0))
        lo = 0
        for rows, post, lens in chunks:
            hi = lo + len(post.gram_key)
            yield (rows, *pair_scores(post, idf_all[lo:hi], lens, S, k, self.sigma, clipped, vs_refs, vs_self))
            lo = hi

    # ---- scoring ------------------------------------------------------------------------

    def score(self, hyps: Any, refs: Any, ref_index: Any = None) -> np.ndarray:
        """CIDEr-D of each hypothesis against its reference set: float64 (H,).

        ``hyps``: (H, T) int array (0-padded; a caption ends at its first 0), a list of token-id
        lists, or a list of strings (split on whitespace). ``refs``: a list of reference sets, each
        a (k, T) int array, a list of token lists, or a list of strings (or one (N, k, T) array).
        ``ref_index`` (H,): hypothesis h is scored against ``refs[ref_index[h]]``; None = identity.
        In corpus mode, document frequencies come from ``refs`` (one document per set), so scoring
        n captions per image with a ``ref_index`` equals n single-caption pycocoevalcap runs.
        """
        each, counts = self._to_each_ref(hyps, refs, ref_index)
        return each.sum(-1) / np.maximum(counts, 1)

    def score_each(self, hyps: Any, refs: Any, ref_index: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """CIDEr-D of each hypothesis against each member of its reference set taken as the single
        reference: ``(scores (H, k_max), counts (H,))``, where ``scores[h, j]`` is hypothesis h
        against reference j of ``refs[ref_index[h]]`` for ``j < counts[h]`` and 0 after (the
        set's size). Same arguments as :meth:`score`, which is ``scores.sum(1) / counts``: with
        fixed document frequencies a score against a set is the mean of the scores against its
        members. (In corpus mode the df still comes from whole sets, one document per set.)
        """
        return self._to_each_ref(hyps, refs, ref_index)

    def _to_each_ref(self, hyps: Any, refs: Any, ref_index: Any) -> tuple[np.ndarray, np.ndarray]:
        """The work of :meth:`score` and :meth:`score_each`: each hypothesis against each reference
        of its set, (H, k_max) with 0 past the set's size, and the set sizes (H,)."""
        strings = has_strings(hyps) or has_strings(refs)
        table = self._table(strings)
        rcaps, counts = sets_from(refs, table, "refs")
        hcaps = caps_from(hyps, table, "hyps")
        H, N = len(hcaps), len(counts)
        ref_index = _checked_index(ref_index, H, N)
        used = np.bincount(ref_index, minlength=N) > 0
        if (counts[used] == 0).any():
            raise ValueError("a reference set scored against is empty")
        if H == 0:
            return np.zeros((0, 0), np.float64), np.zeros(0, np.int64)
        base = self._base(rcaps, hcaps, table=table)

        # groups: (set, chunk of at most m_cap hypotheses); slots: k_max references, then hyps.
        # In corpus mode every set gets a group (its references are documents even if unscored).
        m = np.bincount(ref_index, minlength=N)
        m_cap = int(min(m.max(), 32))
        k_max = int(counts.max() if self.df is None else counts[used].max())
        nchunks = -(-m // m_cap)
        if self.df is None:
            nchunks = np.maximum(nchunks, 1)
        goff = np.cumsum(nchunks) - nchunks
        order = np.argsort(ref_index, kind="stable")
        sset = ref_index[order]
        rank = np.arange(H) - (np.cumsum(m) - m)[sset]
        grp = goff[sset] + rank // m_cap
        hslot = rank % m_cap
        G = int(nchunks.sum())
        set_of_g = np.repeat(np.arange(N), nchunks)
        S = k_max + m_cap
        slot_index = np.full((G, S), -1, np.int64)
        rstart = np.cumsum(counts) - counts
        kk = np.arange(k_max)[None, :]
        slot_index[:, :k_max] = np.where(kk < counts[set_of_g, None], rstart[set_of_g, None] + kk, -1)
        slot_index[grp, k_max + hslot] = len(rcaps) + order
        first = np.zeros(G, bool)
        first[goff] = True  # the first group of each set holds its document
        out_g = np.zeros((G, m_cap, k_max))
        for rows, pair, _ in self._run(concat(rcaps, hcaps), slot_index, k_max, base, doc_slots=k_max,
                                       doc_groups=first, num_docs=N, clipped=True, vs_refs=True, vs_self=False):
            out_g[rows] = pair
        out = np.empty((H, k_max))
        out[order] = out_g[grp, hslot]
        return out, counts[ref_index]

    def pairwise(self, caps: Any, kind: str = "cider-d") -> np.ndarray:
        """Similarity matrices of the m captions of each image: (B, M, M) float64.

        ``caps``: (B, M, T) int array or a list of B lists of M captions (strings or id lists).
        ``kind="cider-d"``: ``K[b,i,j]`` = CIDEr-D of caption i against the single reference j for
        i <= j, mirrored to the lower triangle (docs/metrics.md#self-cider). ``kind="cider"``: plain CIDEr (cosine
        of the tf-idf vectors, no clipping, no length penalty), which is symmetric.
        With ``df=None`` each image's M captions form one document.
        """
        if kind not in ("cider-d", "cider"):
            raise ValueError(f"unknown kind {kind!r}; use 'cider-d' or 'cider'")
        strings = has_strings(caps)
        table = self._table(strings)
        allc, counts = sets_from(caps, table, "caps")
        B = len(counts)
        if B == 0:
            return np.zeros((0, 0, 0))
        M = int(counts[0])
        if (counts != M).any():
            raise ValueError("pairwise: every image needs the same number of captions")
        base = self._base(allc, table=table)
        slot_index = np.arange(B * M, dtype=np.int64).reshape(B, M)
        out = np.zeros((B, M, M))
        for rows, _, K in self._run(allc, slot_index, 0, base, doc_slots=M, doc_groups=None, num_docs=B,
                                    clipped=kind == "cider-d", vs_refs=False, vs_self=True):
            out[rows] = K
        return _mirror(out)  # computed for i <= j

    def score_and_pairwise(self, caps: Any, refs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Both terms of the R-DPP reward in one pass (one sort, one df lookup):
        ``(score(caps[b, i] vs refs[b]) as (B, M), pairwise(caps) as (B, M, M))``.

        ``caps``: (B, M, T) int array or B lists of M captions; ``refs``: B reference sets. Equal
        to ``score(caps.reshape(B*M, T), refs, repeat(arange(B), M)).reshape(B, M)`` and
        ``pairwise(caps)`` when a fixed ``df`` is set (in corpus mode the pairwise part also uses
        the references' document frequencies).
        """
        strings = has_strings(caps) or has_strings(refs)
        table = self._table(strings)
        hcaps, hcounts = sets_from(caps, table, "caps")
        rcaps, counts = sets_from(refs, table, "refs")
        B = len(hcounts)
        if B != len(counts):
            raise ValueError(f"{B} caption sets but {len(counts)} reference sets")
        if B == 0:
            return np.zeros((0, 0)), np.zeros((0, 0, 0))
        M = int(hcounts[0])
        if (hcounts != M).any():
            raise ValueError("score_and_pairwise: every image needs the same number of captions")
        if (counts == 0).any():
            raise ValueError("a reference set scored against is empty")
        base = self._base(rcaps, hcaps, table=table)
        k = int(counts.max())
        S = k + M
        slot_index = np.full((B, S), -1, np.int64)
        kk = np.arange(k)[None, :]
        slot_index[:, :k] = np.where(kk < counts[:, None], (np.cumsum(counts) - counts)[:, None] + kk, -1)
        slot_index[:, k:] = len(rcaps) + np.arange(B * M).reshape(B, M)
        q = np.zeros((B, M))
        K = np.zeros((B, M, M))
        for rows, to_refs, to_self in self._run(concat(rcaps, hcaps), slot_index, k, base, doc_slots=k,
                                                doc_groups=None, num_docs=B, clipped=True, vs_refs=True,
                                                vs_self=True):
            q[rows] = to_refs.sum(-1) / counts[rows, None]
            K[rows] = to_self
        return q, _mirror(K)


def _checked_index(ref_index: Any, H: int, N: int) -> np.ndarray:
    """``ref_index`` (None: the identity) as int64 (H,), every entry a set of the N."""
    if ref_index is None:
        if H != N:
            raise ValueError(f"{H} hypotheses but {N} reference sets; pass ref_index")
        return np.arange(H)
    ref_index = np.asarray(to_numpy(ref_index), np.int64).reshape(-1)
    if len(ref_index) != H:
        raise ValueError(f"ref_index has {len(ref_index)} entries for {H} hypotheses")
    if H and (ref_index.min() < 0 or ref_index.max() >= N):
        raise ValueError(f"ref_index out of range for {N} reference sets")
    return ref_index


def _mirror(K: np.ndarray) -> np.ndarray:
    """Copy the upper triangle of each (M, M) matrix to its lower triangle, in place."""
    i, j = np.triu_indices(K.shape[-1], 1)
    K[:, j, i] = K[:, i, j]
    return K
