"""Fixed document frequencies (``cider_df.h5``): what the training reward and self-CIDEr score with.

Why: in train mode CIDEr-D's idf comes from the training set, not from the captions being scored.
:class:`DocFreq` holds, for each n-gram (n = 1..4), the number of documents (training images)
whose reference set contains it, and the number of documents; it reads and writes the
``cider_df.h5`` format of docs/architecture.md and counts it from references.

What it guarantees: each n-gram is counted once per document; :meth:`DocFreq.lookup` is exact
(an :class:`~rdpp_cli.metrics.cider.hashtable.ExactHash` over exact keys) and gives 0 for an n-gram
never seen, including any n-gram holding a word outside the vocabulary. The table is built once,
on the first lookup, and reused for every later call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rdpp_cli.metrics.cider.captions import Caps, WordTable, has_strings, sets_from
from rdpp_cli.metrics.cider.hashtable import ExactHash
from rdpp_cli.metrics.cider.keys import (
    MAX_BASE,
    N_ORDER,
    digits_to_keys,
    digits_to_tuples,
    keys_to_digits,
    keys_to_tuples,
    pair_keys,
    tuples_to_digits,
    tuples_to_keys,
)
from rdpp_cli.metrics.cider.postings import layout, row_grams, set_chunks


class DocFreq:
    """Fixed document frequencies: for each n-gram (n = 1..4) the number of documents (images)
    whose reference set contains it, and the number of documents.

    ``ngrams`` (K, 4) holds word ids right-padded with 0; ``df`` (K,) float64; ``words`` (optional)
    is the vocabulary (id ``i + 1`` is ``words[i]``) used to map string captions to ids — words
    outside it get fresh ids past the vocabulary, hence df 0 (``max(1, df)`` = 1 in the formula).
    """

    def __init__(self, ngrams: np.ndarray, df: np.ndarray, num_docs: int,
                 words: Sequence[str] | None = None) -> None:
        ngrams = np.asarray(ngrams, np.int64).reshape(-1, N_ORDER)
        df = np.asarray(df, np.float64).reshape(-1)
        if len(ngrams) != len(df):
            raise ValueError(f"DocFreq: {len(ngrams)} n-grams but {len(df)} df values")
        if int(num_docs) < 1:
            raise ValueError("DocFreq: num_docs must be >= 1")
        if len(ngrams) and (ngrams.min() < 0 or (ngrams[:, 0] == 0).any()):
            raise ValueError("DocFreq: n-grams must hold ids >= 1, right-padded with 0")
        self._init(None, df, num_docs, words, 0, ngrams=ngrams)

    def _init(self, digits: np.ndarray | None, df: np.ndarray, num_docs: int, words: Sequence[str] | None,
              base: int, keys: np.ndarray | None = None, ngrams: np.ndarray | None = None) -> None:
        # the n-grams as tuples t1..tn (``_ngrams``) and/or as digits tn..t1 (``_digits``, the
        # canonical form of lookups by digits); whichever is missing is made when first needed
        self._digits = digits
        self._ngrams = ngrams
        self._keys = keys  # base-``base`` keys, when built from references
        self._keys_base = base
        self.df = df
        self.num_docs = int(num_docs)
        self.words = list(words) if words is not None else None
        if digits is not None or ngrams is not None:
            some = digits if digits is not None else ngrams
            top = int(some.max()) if len(some) else 0
        else:  # the largest id is the top digit of the largest unigram key
            top = int(keys[keys < base].max()) if (keys < base).any() else 0
        self.base = max(base, top + 1, (len(self.words) + 1) if self.words else 0, 2)
        self._hash: ExactHash | None = None

    @property
    def ngrams(self) -> np.ndarray:
        """(K, 4) int64: each n-gram's ids t1..tn, right-padded with 0."""
        if self._ngrams is None:
            self._ngrams = self._made(keys_to_tuples, digits_to_tuples, self._digits)
        return self._ngrams

    @property
    def digits(self) -> np.ndarray:
        """(K, 4) int64: each n-gram's ids last word first (tn..t1), right-padded with 0."""
        if self._digits is None:
            self._digits = self._made(keys_to_digits, tuples_to_digits, self._ngrams)
        return self._digits

    def _made(self, from_keys, from_other, other: np.ndarray | None) -> np.ndarray:
        """One form of the n-grams, made from the keys when built from references, else from the other form."""
        return from_keys(self._keys, self._keys_base) if self._keys is not None else from_other(other)

    def __repr__(self) -> str:
        return f"DocFreq({len(self.df)} n-grams, num_docs={self.num_docs}, base={self.base})"

    @property
    def ref_len(self) -> float:
        """``log(num_docs)``: coco-caption's ``ref_len``."""
        return float(np.log(float(self.num_docs)))

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_h5(cls, path: str | Path, words: Sequence[str] | None = None) -> DocFreq:
        """Read ``cider_df.h5`` (``ngrams`` (K,4) int32, ``df`` (K,) float64, attr ``num_docs``).

        ``words`` defaults to ``vocab.json`` beside the file (a data artifact), when present.
        """
        import h5py

        path = Path(path)
        with h5py.File(path, "r") as f:
            ngrams = f["ngrams"][...]
            df = f["df"][...]
            num_docs = int(f.attrs["num_docs"])
        if words is None and (path.parent / "vocab.json").is_file():
            words = json.loads((path.parent / "vocab.json").read_text())["words"]
        return cls(ngrams, df, num_docs, words)

    def save_h5(self, path: str | Path) -> None:
        """Write the ``cider_df.h5`` format of docs/architecture.md."""
        import h5py

        with h5py.File(path, "w") as f:
            self.fill_h5(f)

    def fill_h5(self, f) -> None:
        """Write the ``cider_df.h5`` datasets into the open h5py file ``f``."""
        if len(self.ngrams) and self.ngrams.max() > np.iinfo(np.int32).max:
            raise ValueError("DocFreq.save_h5: ids do not fit int32")
        f.create_dataset("ngrams", data=self.ngrams.astype(np.int32))
        f.create_dataset("df", data=self.df.astype(np.float64))
        f.attrs["num_docs"] = int(self.num_docs)

    @classmethod
    def from_references(cls, refs: Any, words: Sequence[str] | None = None) -> DocFreq:
        """Document frequencies of ``refs`` (a list, one per image, of reference sets), each n-gram
        counted once per image, ``num_docs = len(refs)``.

        Reference sets may hold token ids ((k, T) arrays or id lists) or strings; with strings the
        word table is ``words`` (if given) extended by every new word, or built from the references
        themselves, and is kept in ``.words``.
        """
        table = None
        if has_strings(refs):
            table = WordTable(words or ())
        caps, counts = sets_from(refs, table, "references")
        return cls._from_caps(caps, counts, table.words() if table is not None else words)

    @classmethod
    def _from_caps(cls, caps: Caps, counts: np.ndarray, words: Sequence[str] | None,
                   base: int = 0) -> DocFreq:
        if len(counts) == 0:
            raise ValueError("DocFreq.from_references: no reference sets")
        base = max(base, caps.max_id() + 1, (len(words) + 1) if words else 0, 2)
        keys_all = []
        for lo, hi, slot_index in set_chunks(counts):
            flat, _, _ = layout(caps, slot_index)
            keys, _ = row_grams(flat, base)
            keys_all.append(keys)
        keys = np.concatenate(keys_all) if keys_all else np.zeros((0, N_ORDER), np.int64)
        out = cls.__new__(cls)
        if keys.ndim == 1:
            uniq, df = np.unique(keys, return_counts=True)
            out._init(None, df.astype(np.float64), len(counts), words, base, keys=uniq)
        else:  # relabelled chunks give digit tuples of original ids
            uniq, df = np.unique(keys, axis=0, return_counts=True)
            out._init(uniq, df.astype(np.float64), len(counts), words, base)
        return out

    # ---- lookups ------------------------------------------------------------------------

    def _table(self) -> ExactHash:
        if self._hash is None:
            if self.base <= MAX_BASE:
                if self._keys is not None and self._keys_base == self.base:
                    keys = self._keys
                elif self._ngrams is not None:
                    keys = tuples_to_keys(self._ngrams, self.base)
                else:
                    keys = digits_to_keys(self._digits, self.base)
            else:
                keys = pair_keys(self.digits)
            self._hash = ExactHash(keys, self.df)
        return self._hash

    def lookup_digits(self, d: np.ndarray, log: bool = False) -> np.ndarray:
        """df of n-grams given as (Q, 4) ids, least significant (last word) first, 0-padded
        (``log``: ``log(max(1, df))`` instead)."""
        table = self._table()
        if self.base <= MAX_BASE:
            unknown = (d >= self.base).any(1)
            keys = digits_to_keys(np.where(unknown[:, None], 0, d), self.base)
            out = table.get(keys)
            out[unknown] = 0.0
        else:
            out = table.get(pair_keys(d))
        return np.log(np.maximum(out, 1.0)) if log else out

    def lookup(self, ngrams: np.ndarray) -> np.ndarray:
        """df of n-grams given as (Q, 4) ids t1..tn right-padded with 0 (0.0 when absent)."""
        return self.lookup_digits(tuples_to_digits(np.asarray(ngrams, np.int64).reshape(-1, N_ORDER)))

    def _log_df_of_keys(self, keys: np.ndarray, base: int, relabel: np.ndarray | None) -> np.ndarray:
        """``log(max(1, df))`` of n-grams given as keys in ``base`` (of relabelled ids)."""
        if relabel is None and base == self.base:
            return np.log(np.maximum(self._table().get(keys), 1.0))  # absent: log(max(1, 0)) = 0
        d = keys_to_digits(keys, base)
        if relabel is not None:
            d = relabel[d]
        return self.lookup_digits(d, log=True)
