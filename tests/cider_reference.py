"""The independent reference for tests: CIDEr-D, self-CIDEr, oracle and Div-2 computed with
pycocoevalcap's own ``CiderScorer`` and plain Python, never with rdpp's metrics.

Document frequencies are counted here (one document per image, as ``CiderScorer.compute_doc_freq``)
or read straight from a ``cider_df.h5`` file; scores come from pycocoevalcap's cooking, vectors
and similarity. Captions are whitespace-split strings (coco-caption's ``precook``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np
from pycocoevalcap.cider.cider_scorer import CiderScorer, precook


class FixedDfScorer(CiderScorer):
    """pycocoevalcap's CiderScorer with a fixed df and ref_len swapped in (compute_cider would
    otherwise overwrite ref_len with log(#entries) and count df from its own entries)."""

    ref_len = property(lambda self: self._fixed_ref_len, lambda self, value: None)

    def __init__(self, document_frequency: dict, ref_len: float) -> None:
        self._fixed_ref_len = ref_len
        super().__init__()
        self.document_frequency = defaultdict(float, document_frequency)


def corpus_df(refsets: list[list[str]]) -> tuple[dict, float]:
    """Document frequencies of reference sets (each n-gram once per set) and ``log(#sets)``."""
    df: dict = defaultdict(float)
    for refs in refsets:
        for gram in {g for r in refs for g in precook(r)}:
            df[gram] += 1
    return df, math.log(len(refsets))


def df_from_h5(path: Path, words: list[str]) -> tuple[dict, float]:
    """``cider_df.h5`` read with h5py, its ids mapped to ``words`` (id i+1 = words[i]); the training
    reward's end token, id ``len(words) + 1``, becomes ``"<eos>"`` (a token no evaluated caption holds)."""
    with h5py.File(path, "r") as f:
        grams, df, num_docs = f["ngrams"][...], f["df"][...], int(f.attrs["num_docs"])

    def word(i: int) -> str:
        return words[i - 1] if 1 <= i <= len(words) else "<eos>" if i == len(words) + 1 else f"<id {i}>"

    return {tuple(word(int(t)) for t in g if t): float(v) for g, v in zip(grams, df)}, math.log(num_docs)


def cider_d(pairs: list[tuple[str, list[str]]], df: dict, ref_len: float) -> np.ndarray:
    """CIDEr-D of each (hypothesis, references) pair with the given df."""
    sc = FixedDfScorer(df, ref_len)
    for hyp, refs in pairs:
        sc.cook_append(hyp, refs)
    return np.array(sc.compute_cider())


def per_caption(captions: list[list[str]], refsets: list[list[str]], df: dict, ref_len: float) -> list[np.ndarray]:
    """CIDEr-D of every caption of every image against that image's references."""
    flat = cider_d([(c, refs) for caps, refs in zip(captions, refsets) for c in caps], df, ref_len)
    out, k = [], 0
    for caps in captions:
        out.append(flat[k:k + len(caps)])
        k += len(caps)
    return out


def self_cider(captions: list[str], df: dict, ref_len: float) -> float:
    """Self-CIDEr as the authors' code computes it: K[i, j] = CIDEr-D of c_i against {c_j} for
    i <= j, mirrored; ``-log(sqrt(max sv) / sum sqrt(sv)) / log(m)`` of ``np.linalg.svd(K)``."""
    m = len(captions)
    iu = [(i, j) for i in range(m) for j in range(i, m)]
    vals = cider_d([(captions[i], [captions[j]]) for i, j in iu], df, ref_len)
    K = np.zeros((m, m))
    for (i, j), v in zip(iu, vals):
        K[i, j] = K[j, i] = v
    s = np.linalg.svd(K, compute_uv=False)
    if s.max() == 0:  # every caption empty
        return 0.0
    return float(-np.log(np.sqrt(s.max()) / np.sqrt(s).sum()) / np.log(m))


def div_n(captions: list[str], n: int) -> float:
    """Distinct n-grams among an image's captions / number of words in them."""
    grams, words = set(), 0
    for c in captions:
        w = c.split()
        words += len(w)
        grams |= {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}
    return len(grams) / words if words else float("nan")


def scores_of_samples(samples_dir: Path, data_dir: Path) -> dict:
    """What ``rdpp score --oracle --self-cider --diversity`` should report for a samples artifact
    of a data artifact (whose raw references are plain lower-case tokens, so coco-caption's PTB
    tokenizer leaves them as they are): accuracy = mean per-caption CIDEr-D (corpus df of the
    scored images' references), oracle = mean of the per-image best, self-CIDEr with the training
    df of ``cider_df.h5``, Div-2."""
    samples = json.loads((samples_dir / "samples.json").read_text())
    words = json.loads((data_dir / "vocab.json").read_text())["words"]
    with h5py.File(data_dir / "captions.h5", "r") as f:
        row = {int(i): k for k, i in enumerate(f["image_ids"][...])}
        start, end, raw = f["label_start"][...], f["label_end"][...], f["raw"][...]
    refsets = []
    for s in samples:
        k = row[s["image_id"]]
        refsets.append([(r.decode() if isinstance(r, bytes) else str(r)) for r in raw[start[k]:end[k]]])
    captions = [s["captions"] for s in samples]
    df, ref_len = corpus_df(refsets)
    per = per_caption(captions, refsets, df, ref_len)
    train_df, train_len = df_from_h5(data_dir / "cider_df.h5", [w.lower() for w in words])
    return {
        "mean_cider": float(np.mean([p.mean() for p in per])),
        "oracle_cider": float(np.mean([p.max() for p in per])),
        "self_cider": float(np.mean([self_cider(c, train_df, train_len) for c in captions])) if len(captions[0]) > 1
        else None,
        "div2": float(np.nanmean([div_n(c, 2) for c in captions])),
        "images": len(samples),
    }
