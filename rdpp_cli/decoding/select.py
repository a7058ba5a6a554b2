"""Choosing K captions per image out of C candidates, without references (`rdpp sample --select`).

- ``dpp``      greedy MAP inference of the DPP ``L = S ⊙ q qᵀ`` — the kernel of the R-DPP reward used
               at test time: ``S`` the pairwise CIDEr-D among the candidates (training df), ``q`` their
               quality (``consensus`` or ``logprob``);
- ``mbr``      the K candidates of highest consensus (minimum Bayes risk with CIDEr-D as the utility);
- ``logprob``  the K candidates of highest (length-normalised) model probability;
- ``consensus`` the K candidates of highest consensus against the captions of the image's nearest
               training images (``rdpp_cli.decoding.consensus``: the CVAE papers' best-5 protocol),
               in rank order, so the first is the top-1.

Qualities of candidate i of an image, without references:

- ``consensus``: its mean CIDEr-D against the *other* C - 1 candidates of the image (training df),
  i.e. its expected utility under the model's own samples (duplicates count: they are the model's
  mass);
- ``logprob``: ``exp(log p(c_i) / (len_i + 1))``, the geometric mean of its token probabilities
  (the EOS counted).

Exact duplicates are never chosen twice while a distinct candidate is left; an image with fewer
than K distinct candidates gets its distinct ones first, then copies of the best of them.

:func:`greedy_map` is the incremental-Cholesky greedy of Chen, Zhang & Zhou ("Fast greedy MAP
inference for determinantal point process", NeurIPS 2018): at each of the K steps it adds the
candidate with the largest ``d_i² = L_ii - |c_i|²`` (the factor by which it multiplies ``det L_Y``)
and updates every ``c_i`` with one row of ``L``; O(C·K²) per image, batched over images, with no
Python loop over candidates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rdpp_cli.decoding.consensus import NEIGHBOURS, TOP_M, NeighbourConsensus

SELECTS = ("dpp", "mbr", "logprob", "consensus")
QUALITIES = ("consensus", "logprob")
IMPLIED = {"mbr": "consensus", "logprob": "logprob", "consensus": "neighbours"}  # what a method ranks by


@dataclass
class SelectConfig:
    method: str = "dpp"  # dpp | mbr | logprob | consensus
    candidates: int = 50  # C samples drawn per image, K = n of them kept
    quality: str | None = None  # dpp: consensus (default) | logprob; mbr: consensus; logprob: logprob
    neighbours: int | None = None  # consensus: the k nearest training images (default NEIGHBOURS)

    def check(self, n: int) -> "SelectConfig":
        """Fill the quality each method implies (and consensus's neighbours); raise ValueError with
        one clear line otherwise."""
        if self.method not in SELECTS:
            raise ValueError(f"unknown --select '{self.method}'; use one of {', '.join(SELECTS)}")
        implied = IMPLIED.get(self.method)
        if self.quality is None:
            self.quality = implied or "consensus"
        if self.quality not in QUALITIES and self.quality != implied:
            raise ValueError(f"unknown --quality '{self.quality}'; use one of {', '.join(QUALITIES)}")
        if implied and self.quality != implied:
            raise ValueError(f"--select {self.method} ranks by {implied}; --quality {self.quality} is for "
                             f"--select dpp (leave --quality out)")
        if self.method != "consensus" and self.neighbours is not None:
            raise ValueError("--neighbours is the number of training images --select consensus ranks against; "
                             "add --select consensus or leave --neighbours out")
        if self.method == "consensus":
            self.neighbours = NEIGHBOURS if self.neighbours is None else self.neighbours
            if self.neighbours < 1:
                raise ValueError(f"--neighbours {self.neighbours} must be at least 1")
        if self.candidates < max(n, 2):
            raise ValueError(f"--candidates {self.candidates} must be at least --n {n} (and at least 2)")
        return self

    def tag(self) -> str:
        """The selection's part of a samples artifact's name: ``dpp-consensus``, ``mbr``, ``consensus-k60``."""
        return {"dpp": f"dpp-{self.quality}", "consensus": f"consensus-k{self.neighbours}"}.get(self.method, self.method)

    def settings(self) -> dict:
        """What a samples manifest records of the selection beyond select, candidates and quality."""
        return {"neighbours": self.neighbours, "consensus_top_m": TOP_M} if self.method == "consensus" else {}

    def describe(self) -> str:
        """How the kept captions were chosen, for the stage's closing table."""
        if self.method == "consensus":
            return f"consensus with the captions of the {self.neighbours} nearest training images, in rank order"
        return f"{self.method} ({self.quality} quality)"


# -- the greedy MAP step (pure) -------------------------------------------------------------------

def greedy_map(L: Tensor | np.ndarray, k: int, valid: Tensor | np.ndarray | None = None,
               fallback: Tensor | np.ndarray | None = None, eps: float = 1e-9) -> Tensor | np.ndarray:
    """Greedy MAP of the DPPs ``L`` (B, C, C) (symmetric): the indices (B, k) of the chosen items,
    in the order chosen (a tensor for a tensor ``L``, on its device; else an array).

    Each step adds the item with the largest gain ``d² = det L_{Y+i} / det L_Y`` among the
    ``valid`` ones (B, C) not chosen yet (default: all). When no such item has a gain above
    ``eps × max_i L_ii`` — ``L_Y`` would stop being positive definite, e.g. fewer independent
    items than k, or a kernel that is not PSD — the image's remaining items are taken by
    ``fallback`` (B, C) (default: the diagonal of L), valid ones first, then the others.
    Computed in float64 with numpy (at 50 candidates its per-call cost is ~8x below torch's).
    """
    if isinstance(L, Tensor):
        arr = lambda x: None if x is None else x.detach().cpu().numpy()  # noqa: E731
        return torch.from_numpy(greedy_map(arr(L), k, arr(valid), arr(fallback), eps)).to(L.device)
    L = np.asarray(L, np.float64)
    B, C, _ = L.shape
    if not 1 <= k <= C:
        raise ValueError(f"greedy_map: k = {k} must be between 1 and the {C} items")
    ar = np.arange(B)
    d2 = np.diagonal(L, axis1=1, axis2=2).copy()  # (B, C) gains of the first step
    tol = eps * np.maximum(np.abs(d2).max(1), np.finfo(np.float64).tiny)  # (B,)
    valid = np.ones((B, C), bool) if valid is None else np.asarray(valid, bool)
    fallback = d2.copy() if fallback is None else np.asarray(fallback, np.float64)
    cis = np.zeros((B, k, C))  # rows of the incremental Cholesky factor
    chosen = np.zeros((B, C), bool)
    active = np.ones(B, bool)  # still choosing by the DPP
    out = np.empty((B, k), np.int64)
    for t in range(k):
        avail = valid & ~chosen
        gain = np.where(avail, d2, -np.inf)
        j = gain.argmax(1)
        active &= gain[ar, j] > tol
        if not active.all():
            pool = np.where(avail.any(1, keepdims=True), avail, ~chosen)
            j = np.where(active, j, np.where(pool, fallback, -np.inf).argmax(1))
        out[:, t] = j
        chosen[ar, j] = True
        if t == k - 1:
            break
        dj = np.sqrt(np.maximum(d2[ar, j], tol))  # (B,)
        cj = cis[ar, :t, j]  # (B, t): the chosen item's column of the factor
        e = (L[ar, j] - np.einsum("bt,btc->bc", cj, cis[:, :t])) / dj[:, None]
        e *= active[:, None]  # images past their DPP steps: no update (and no NaN)
        cis[:, t] = e
        d2 -= e * e
    return out


def rank_distinct(score: Tensor, k: int, valid: Tensor | None = None) -> Tensor:
    """The k items of highest ``score`` (B, C), ``valid`` items (B, C) first: (B, k) indices.
    Ties keep the candidates' order."""
    order = torch.argsort(score, dim=1, descending=True, stable=True)
    if valid is not None:
        invalid_sorted = (~valid.to(torch.bool)).gather(1, order).to(torch.int8)
        order = order.gather(1, torch.argsort(invalid_sorted, dim=1, stable=True))
    return order[:, :k]


# -- candidates' qualities and kernel ---------------------------------------------------------------

def first_occurrence(tokens: Tensor) -> Tensor:
    """(B, C) True where no earlier candidate of the image has exactly the same tokens (B, C, T)."""
    B, C, T = tokens.shape
    pos = torch.arange(B * C, device=tokens.device)
    rows = torch.cat([pos.div(C, rounding_mode="floor").unsqueeze(1), tokens.reshape(B * C, T)], 1)
    _, group = torch.unique(rows, dim=0, return_inverse=True)  # equal rows of one image: one group
    first = torch.full((B * C,), B * C, dtype=torch.long, device=tokens.device)
    first = first.scatter_reduce(0, group, pos, "amin")
    return (first[group] == pos).view(B, C)


def logprob_quality(seq_logprob: Tensor, lengths: Tensor) -> Tensor:
    """``exp(log p / (words + 1))``: the geometric mean of the token probabilities, EOS counted."""
    return torch.exp(seq_logprob.to(torch.float64) / (lengths.to(torch.float64) + 1))


def train_scorer(data, max_len: int):
    """The training reward's CIDEr-D (``TrainCider``: the data's ``cider_df.h5``, EOS counted) for
    candidates of at most ``max_len`` words, which it also uses as references (so a candidate ends
    with its EOS exactly when it is shorter than ``max_len``, as a hypothesis or as a reference).
    Refuses, in one line, a data artifact whose df does not count the EOS."""
    from rdpp_cli.metrics.train_cider import TrainCider

    return TrainCider.for_data(data, max_len, ref_len=max_len)


def _cider_terms(tokens: np.ndarray, scorer, consensus: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """The one place that scores candidates: ``(consensus (B, C), S (B, C, C))`` for the token ids
    (B, C, T) of C candidates per image, with ``scorer`` (:func:`train_scorer`: the reward's
    training-mode CIDEr-D).

    ``S`` is the reward's kernel (``scorer.pairwise``); ``consensus[i]`` is the mean CIDEr-D of
    candidate i against each other candidate as a single reference (None unless asked: it costs
    about 2x the kernel). With fixed document frequencies a score against a set is the mean of the
    scores against its members, so it is read off one scoring against all C candidates:
    ``(C · mean_all - S_ii) / (C - 1)`` (``S_ii``, a caption against itself, has no direction).
    """
    if not consensus:
        return None, scorer.pairwise(tokens)
    C = tokens.shape[1]
    to_all, S = scorer.score_and_pairwise(tokens, list(tokens))
    return (C * to_all - np.diagonal(S, axis1=1, axis2=2)) / (C - 1), S


def select(tokens: Tensor, seq_logprob: Tensor, lengths: Tensor, k: int, cfg: SelectConfig, scorer) -> Tensor:
    """The k of C candidates per image chosen by ``cfg`` (a checked :class:`SelectConfig`): (B, k)
    indices into the candidates, in the order chosen. ``tokens`` (B, C, T), ``seq_logprob`` and
    ``lengths`` (B, C) are ``Decoded``'s fields; ``scorer`` the CIDEr-D of :func:`train_scorer`
    (unused by ``logprob``)."""
    tokens, seq_logprob, lengths = tokens.cpu(), seq_logprob.cpu(), lengths.cpu()
    valid = first_occurrence(tokens)
    q_lp = logprob_quality(seq_logprob, lengths)
    if cfg.method == "logprob":
        return rank_distinct(q_lp, k, valid)
    consensus, S = _cider_terms(tokens.numpy(), scorer, consensus=cfg.quality == "consensus")
    if cfg.method == "mbr":
        return rank_distinct(torch.from_numpy(consensus), k, valid)
    q = torch.from_numpy(consensus) if cfg.quality == "consensus" else q_lp
    L = torch.from_numpy(S) * q.unsqueeze(2) * q.unsqueeze(1)
    return greedy_map(L, k, valid=valid, fallback=q)


def consensus_select(tokens: Tensor, images, k: int, ranker: NeighbourConsensus) -> Tensor:
    """The k of C candidates (B, C, T) of data rows ``images`` (B,) of highest consensus against
    their neighbours' captions (``ranker``), highest first: (B, k) indices; an exact duplicate only
    after every distinct candidate, ties in decoding order."""
    tokens = tokens.cpu()
    score = torch.from_numpy(ranker.scores(tokens.numpy(), images))
    return rank_distinct(score, k, first_occurrence(tokens))


class Chooser:
    """``select`` over the decoding batches of ``rdpp sample``; ``seconds`` adds up its time.
    ``images``: the data rows to be captioned (``consensus`` finds their neighbours when made, and
    each call names its batch's rows)."""

    def __init__(self, cfg: SelectConfig, k: int, data, max_len: int, images=None) -> None:
        t0 = time.perf_counter()
        self.cfg, self.k = cfg, k
        self.scorer = train_scorer(data, max_len) if cfg.method in ("dpp", "mbr") else None
        self.ranker = None
        if cfg.method == "consensus":
            if images is None:
                raise ValueError("--select consensus needs the images it captions (their neighbours)")
            self.ranker = NeighbourConsensus(data, images, cfg.neighbours, TOP_M, max_len)
        self.seconds = time.perf_counter() - t0

    def __call__(self, dec, images=None) -> np.ndarray:
        t0 = time.perf_counter()
        if self.ranker is not None:
            idx = consensus_select(dec.tokens, images, self.k, self.ranker).numpy()
        else:
            idx = select(dec.tokens, dec.seq_logprob, dec.lengths, self.k, self.cfg, self.scorer).numpy()
        self.seconds += time.perf_counter() - t0
        return idx
