"""Diversity statistics of the n captions per image and best-of-n oracles (docs/metrics.md#definitions).

* ``div_n``: distinct n-grams among an image's captions divided by the number of words in them
  (Div-1, Div-2), per image.
* ``mbleu4``: each caption's BLEU-4 against the image's other captions (coco-caption's sentence
  BLEU: ``BleuScorer`` with the "closest" reference length), averaged over the captions; lower is
  more diverse. Vectorized; equal to pycocoevalcap's per-sentence numbers.
* ``distinct_captions``: distinct caption strings per image; ``vocabulary_size``: distinct words
  over all captions; ``novel_fraction``: captions not among the training captions.
* ``ending_share``: per image, the share of captions whose last word is one of a set —
  ``BAD_ENDINGS`` (words that cannot end an English sentence: a caption cut mid-phrase, the failure
  a training reward without the end token lets through) or the UNK token.
* ``oracle``: per image the best (max) and the average (mean) of per-caption scores.

Captions are strings split on whitespace (or token-id lists); callers normalise them first (the
scoring stage uses the PTB-tokenized captions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from rdpp_cli.metrics.cider import N_ORDER, ngram_postings

_CHUNK_IMAGES = 2000


def _by_count(captions: Sequence[Sequence]) -> Iterable[tuple[np.ndarray, int]]:
    """Indices of images grouped by their number of captions (the vectorized helpers need equal
    counts), in chunks of bounded size."""
    counts = np.array([len(c) for c in captions], dtype=np.int64)
    for m in np.unique(counts):
        idx = np.flatnonzero(counts == m)
        for lo in range(0, len(idx), _CHUNK_IMAGES):
            yield idx[lo:lo + _CHUNK_IMAGES], int(m)


def div_n(captions: Sequence[Sequence[str]], n: int) -> np.ndarray:
    """Div-n per image: distinct n-grams of its captions / number of words in them (0 if none)."""
    if not 1 <= n <= N_ORDER:
        raise ValueError(f"div_n supports n = 1..{N_ORDER}")
    out = np.zeros(len(captions))
    for idx, m in _by_count(captions):
        if m == 0:
            continue
        post, B, _ = ngram_postings([captions[i] for i in idx])
        rows = post.row[post.gram_start]
        distinct = np.bincount(rows // N_ORDER, weights=(rows % N_ORDER == n - 1), minlength=B)
        uni = post.row % N_ORDER == 0
        words = np.bincount(post.row[uni] // N_ORDER, weights=post.count[uni], minlength=B)
        out[idx] = np.divide(distinct, words, out=np.zeros(B), where=words > 0)
    return out


def sentence_bleu_vs_others(captions: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """BLEU-4 of every caption against the other captions of its image, per image (m,) arrays;
    NaN where an image has a single caption. Equal to pycocoevalcap's per-sentence BLEU-4
    (``BleuScorer.compute_score(option="closest")``) with those references."""
    tiny, small = 1e-15, 1e-9
    out: list[np.ndarray] = [np.full(len(c), np.nan) for c in captions]
    for idx, m in _by_count(captions):
        if m < 2:
            continue
        post, B, M = ngram_postings([captions[i] for i in idx])
        if post.count.size:
            gid, cnt = post.gram, post.count
            top1 = np.maximum.reduceat(cnt, post.gram_start)
            is_top = cnt == top1[gid]
            n_top = np.bincount(gid, weights=is_top, minlength=len(top1))
            top2 = np.maximum.reduceat(np.where(is_top, 0.0, cnt), post.gram_start)
            # the highest count among the *other* captions of the image
            other = np.where(~is_top | (n_top[gid] >= 2), top1[gid], top2[gid])
            clipped = np.minimum(cnt, other)
            correct = np.bincount(post.row * M + post.slot,  # row = image * 4 + (n - 1)
                                  weights=clipped, minlength=B * N_ORDER * M).reshape(B, N_ORDER, M)
            uni = post.row % N_ORDER == 0
            length = np.bincount(post.row[uni] // N_ORDER * M + post.slot[uni], weights=cnt[uni],
                                 minlength=B * M).reshape(B, M)
        else:
            correct = np.zeros((B, N_ORDER, M))
            length = np.zeros((B, M))
        # "closest" reference length among the others, ties to the shorter one
        diff = np.abs(length[:, None, :] - length[:, :, None])  # (B, i, j)
        key = diff * (4 * (length.max() + 1)) + length[:, None, :]
        key[:, np.arange(M), np.arange(M)] = np.inf
        j = key.argmin(-1)
        reflen = np.take_along_axis(length, j, 1)
        bleu = np.ones((B, M))
        for k in range(N_ORDER):
            guess = np.maximum(length - k, 0.0)
            bleu = bleu * ((correct[:, k] + tiny) / (guess + small))
        b4 = bleu ** (1.0 / N_ORDER)
        ratio = (length + tiny) / (reflen + small)
        b4 = np.where(ratio < 1, b4 * np.exp(1 - 1 / np.where(ratio < 1, ratio, 1.0)), b4)
        for r, i in enumerate(idx):
            out[i] = b4[r]
    return out


def mbleu4(captions: Sequence[Sequence[str]]) -> np.ndarray:
    """mBLEU-4 per image: mean over its captions of BLEU-4 against the other captions (NaN for a
    single caption)."""
    return np.array([np.mean(b) if len(b) > 1 else np.nan for b in sentence_bleu_vs_others(captions)])


def distinct_captions(captions: Sequence[Sequence[str]]) -> np.ndarray:
    """Number of distinct captions per image."""
    return np.array([len(set(c)) for c in captions], dtype=np.float64)


def vocabulary_size(captions: Sequence[Sequence[str]]) -> int:
    """Number of distinct words over all captions of all images."""
    return len({w for caps in captions for c in caps for w in c.split()})


def novel_fraction(captions: Sequence[Sequence[str]], training: Iterable[str]) -> float:
    """Fraction of all generated captions that are not a training caption (whitespace-normalised)."""
    seen = {" ".join(t.split()) for t in training}
    flat = [" ".join(c.split()) for caps in captions for c in caps]
    return float(np.mean([c not in seen for c in flat])) if flat else float("nan")


# Words that cannot end an English sentence: the articles, the prepositions captions use (those that
# are also adverbs, e.g. "outside", "below", "up", are left out), the coordinating conjunctions,
# and possessive determiners. A caption that ends in one stopped mid-phrase ("a man riding a",
# "a plate of food on a table with").
BAD_ENDINGS = frozenset(
    "a an the "
    "of in on at with by for to from into onto near under over above behind beside beneath through across along "
    "around between against toward towards among upon via during "
    "and or but nor "
    "its their his my your our".split())


def ending_share(captions: Sequence[Sequence[str]], words: Iterable[str] = BAD_ENDINGS) -> np.ndarray:
    """Per image, the share of its non-empty captions whose last word is in ``words`` (NaN when it
    has none). With ``BAD_ENDINGS``: the bad-ending rate; with ``{"unk"}``: captions ending in UNK."""
    words = frozenset(words)
    out = np.full(len(captions), np.nan)
    for i, caps in enumerate(captions):
        last = [c.split()[-1] for c in caps if c.split()]
        if last:
            out[i] = float(np.mean([w in words for w in last]))
    return out


def oracle(per_caption: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Best-of-n: per image the max and the mean of its captions' scores."""
    best = np.array([np.max(s) if len(s) else np.nan for s in per_caption])
    mean = np.array([np.mean(s) if len(s) else np.nan for s in per_caption])
    return best, mean
