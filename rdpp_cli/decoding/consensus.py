"""Consensus re-ranking against the captions of the nearest training images (``--select consensus``).

The CVAE line of diverse captioning reports its accuracy and diversity on the best 5 of 100
samples per image, ranked by consensus re-ranking (docs/scoring.md#the-consensus-best-5-protocol
gives every setting and its source). For an image:

1. its **neighbours** are the k training images whose pooled CNN features (``features.h5`` ``fc``,
   what the papers' fc7 is here) are most similar to its own by cosine similarity (Devlin et al.
   2015); an image of the training split is not its own neighbour;
2. each candidate caption is scored with CIDEr-D against every caption of those neighbours taken as
   the single reference, and its **consensus** is the sum of its m highest scores (Mao et al.'s
   consensus re-ranking; the m highest keep outlying neighbour captions out). CIDEr-D here is the
   training reward's (:class:`~rdpp_cli.metrics.train_cider.TrainCider`: the data artifact's
   ``cider_df.h5``, the end token counted), on token ids, as the neighbours' captions are training
   references;
3. the candidates are ranked by consensus (``select.rank_distinct``: highest first, ties in decoding
   order, an exact duplicate only after every distinct candidate).

Defaults: k = :data:`NEIGHBOURS` = 60 and m = :data:`TOP_M` = 125, the values of the released
consensus re-ranking code for CIDEr (mRNN-CR, ``conf_cr.py``: ``k_cider = 60``, ``m_cider = 125``).

The neighbour search is one pass over the training features in blocks of :data:`BLOCK` rows
(fewer when the images captioned times the block would pass :data:`CELLS`): a matrix product of
the unit-normalised query and block features, then a merge that keeps each query's k best
(:func:`cosine_neighbours`; no Python loop over images).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rdpp_cli.console import progress
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import TrainCider

NEIGHBOURS = 60  # k nearest training images (mRNN-CR's k_cider)
TOP_M = 125  # the m highest CIDEr-D scores against the neighbours' captions that are summed (m_cider)
BLOCK = 4096  # training images per matrix product (fewer when many images are captioned:
CELLS = 1 << 25  # at most this many query x training similarities, 128 MB, at a time)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` scaled to unit L2 norm, float32 (a zero row stays zero: cosine 0 with anything)."""
    x = np.asarray(x, np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1)


def _top_k_of_block(sims: np.ndarray, k: int) -> np.ndarray:
    """Columns (Q, k) of the k largest entries of each row of ``sims`` (Q, B), in column order;
    among entries equal to the k-th largest, the lowest columns."""
    Q, B = sims.shape
    if B <= k:
        return np.broadcast_to(np.arange(B), (Q, B))
    kth = np.partition(sims, B - k, axis=1)[:, B - k, None]
    above = sims > kth
    tied = sims == kth
    need = k - above.sum(1, keepdims=True)  # how many of the tied ones to take
    take = above | (tied & (np.cumsum(tied, axis=1) <= need))
    return np.nonzero(take)[1].reshape(Q, k)


def cosine_neighbours(queries: np.ndarray, blocks: Iterable[np.ndarray], k: int,
                      exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of a training matrix most cosine-similar to each row of ``queries`` (Q, D).

    ``blocks``: the training matrix as consecutive blocks of rows (arrays (B_i, D)); ``exclude``
    (Q,): a training row each query may not take (its own; -1 for none). Returns ``(rows (Q, k)
    int64, similarities (Q, k) float32)``, most similar first, ties to the lower row; with fewer
    than k rows to choose from, the missing places hold row -1 and similarity -inf.
    """
    q = unit_rows(queries)
    Q = len(q)
    best_sim = np.full((Q, k), -np.inf, np.float32)
    best_row = np.full((Q, k), -1, np.int64)
    start = 0
    for blk in blocks:
        sims = q @ unit_rows(blk).T  # (Q, B)
        rows = start + np.arange(sims.shape[1])
        if exclude is not None:
            sims[np.asarray(exclude)[:, None] == rows[None, :]] = -np.inf
        cols = _top_k_of_block(sims, k)
        # the kept k first (earlier blocks: lower rows), then this block's in row order, so a
        # stable sort on similarity leaves ties in row order
        cand_sim = np.concatenate([best_sim, np.take_along_axis(sims, cols, 1)], 1)
        cand_row = np.concatenate([best_row, rows[cols]], 1)
        order = np.argsort(-cand_sim, axis=1, kind="stable")[:, :k]
        best_sim, best_row = np.take_along_axis(cand_sim, order, 1), np.take_along_axis(cand_row, order, 1)
        start += len(rows)
    return best_row, best_sim


def top_m_sum(scores: np.ndarray, m: int) -> np.ndarray:
    """Sum of the m highest entries of each row of ``scores`` (H, R) (all of them when R <= m).
    CIDEr-D is never negative, so 0 padding past a row's references changes no sum."""
    R = scores.shape[1]
    if R > m:
        scores = np.partition(scores, R - m, axis=1)[:, R - m:]
    return scores.sum(1)


class NeighbourConsensus:
    """Consensus scores of the candidates of ``images`` (rows of the data artifact ``data``, a
    ``DataArtifact``) against the captions of their ``k`` nearest training images.

    The neighbours of every image are found once, when made (a progress bar over the training
    images); :meth:`scores` then scores one decoding batch. ``max_len``: the sampling length limit
    (a caption that long has no end token, as in the reward)."""

    def __init__(self, data, images, k: int = NEIGHBOURS, top_m: int = TOP_M, max_len: int | None = None) -> None:
        images = np.asarray(images, np.int64)
        train = data.split_indices("train")
        position = np.full(len(data.image_ids), -1, np.int64)
        position[train] = np.arange(len(train))
        exclude = position[images]  # an image of the training split is not its own neighbour
        usable = len(train) - int((exclude >= 0).any())
        if k > usable:
            raise RdppError(f"--neighbours {k}: data artifact {data.path} has {usable} training images an image can "
                            f"take as neighbours; use --neighbours {usable} or fewer")
        self.data, self.k, self.top_m = data, int(k), int(top_m)
        self.scorer = TrainCider.for_data(data, max_len)
        block = max(256, min(BLOCK, CELLS // max(len(images), 1)))
        rows, _ = cosine_neighbours(data.fc_rows(images), self._training_blocks(train, block), self.k, exclude)
        self.neighbours = {int(i): train[r] for i, r in zip(images, rows)}  # data rows, nearest first

    def _training_blocks(self, train: np.ndarray, block: int) -> Iterable[np.ndarray]:
        """The training images' fc features, ``block`` rows at a time, with a progress bar."""
        with progress("images") as bar:
            task = bar.add_task(f"{self.k} nearest training images", total=len(train), info="")
            for lo in range(0, len(train), block):
                yield self.data.fc_rows(train[lo:lo + block])
                bar.advance(task, min(block, len(train) - lo))

    def references(self, image: int) -> np.ndarray:
        """The encoded captions (R, L) of the neighbours of data row ``image``, nearest first."""
        return np.concatenate(self.data.references_ids(self.neighbours[int(image)]))

    def scores(self, tokens: np.ndarray, images) -> np.ndarray:
        """Consensus (B, C) of the candidates ``tokens`` (B, C, T) of data rows ``images`` (B,):
        the sum of each candidate's ``top_m`` highest CIDEr-D scores against its image's
        neighbour captions. Each distinct caption of an image is scored once."""
        tokens = np.asarray(tokens)
        B, C, T = tokens.shape
        refs = [self.references(i) for i in images]
        keyed = np.concatenate([np.repeat(np.arange(B), C)[:, None], tokens.reshape(B * C, T)], 1)
        distinct, inverse = np.unique(keyed, axis=0, return_inverse=True)
        each, _ = self.scorer.score_each(distinct[:, 1:], refs, distinct[:, 0])
        return top_m_sum(each, self.top_m)[inverse.reshape(-1)].reshape(B, C)
