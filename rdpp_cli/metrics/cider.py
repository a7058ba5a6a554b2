"""Exact, vectorized CIDEr-D (coco-caption's ``Cider``), for scoring and for the training reward.

The definition (DESIGN §4) is pycocoevalcap's ``CiderScorer``: for n = 1..4 a caption's vector holds
``tf(g) * (log(N_docs) - log(max(1, df(g))))`` for each n-gram g; between a hypothesis h and a
reference r, ``val_n = sum_g min(h_g, r_g) * r_g / (|h_n| |r_n|)`` (the raw sum when a norm is 0),
times ``exp(-(len_h - len_r)^2 / (2 sigma^2))`` where ``len`` is the number of bigrams (tokens - 1,
0 for an empty caption), and the score is 10 x the mean over n, averaged over the references.

How it is computed (no Python loop over n-grams or captions; docs/metrics.md has the details):

* Captions become int64 token ids (0 ends a caption). An n-gram's key is its ids written in base
  ``B = max id + 1``: ``t1*B^(n-1) + ... + tn``. Ids are >= 1, so keys are exact and distinct
  across orders as long as ``B^4 < 2^63`` (vocabularies up to 55,107 words); above that, each chunk
  of images is relabelled to the ids it actually uses, which keeps every key exact for any
  vocabulary size.
* Captions that are compared (the references of an image and the hypotheses scored against them,
  or the m samples of an image) share one row per (image, n). Sorting the row, with the caption's
  slot packed into the low bits, is the join: runs of equal values are postings (one caption's
  count of one n-gram), and the postings of one n-gram are adjacent, references first.
* With ``v = tf * idf / |vector|`` per posting, ``val_n`` of a pair is the sum over the n-grams they
  share of ``v_h * v_r * min(1, r / h)``: each hypothesis posting pairs with a contiguous range of
  postings, and one ``bincount`` adds the pairs up. A caption against itself is read off its norms.
* Fixed document frequencies (``cider_df.h5``) come from an exact hash table (buckets of one cache
  line; every probe compares the whole key); corpus mode counts them from the postings of the
  references being scored, one document per reference set, exactly as pycocoevalcap does.

Results equal pycocoevalcap to ~1e-15 (only the order of floating-point additions differs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

N_ORDER = 4
SIGMA = 6.0
_SENT = np.iinfo(np.int64).max
_MAX_BASE = 55108  # largest B with B**4 < 2**63
_CHUNK_ELEMS = 1 << 20  # groups x orders x slots x row width per chunk: keeps the work in cache


# ----------------------------------------------------------------------------------------------
# captions -> token ids
# ----------------------------------------------------------------------------------------------

class _Caps:
    """A list of captions as token ids: either a padded (C, T) matrix (0 after the end) or ragged
    (``ids`` concatenated, ``lens`` per caption)."""

    __slots__ = ("mat", "ids", "lens")

    def __init__(self, mat: np.ndarray | None = None, ids: np.ndarray | None = None,
                 lens: np.ndarray | None = None) -> None:
        self.mat, self.ids, self.lens = mat, ids, lens

    def __len__(self) -> int:
        return len(self.mat) if self.mat is not None else len(self.lens)

    def max_id(self) -> int:
        a = self.mat if self.mat is not None else self.ids
        return int(a.max()) if a.size else 0

    def word_counts(self) -> np.ndarray:
        """(C,) the number of words of each caption."""
        if self.mat is not None:
            return (self.mat != 0).sum(1)
        return self.lens

    def ragged(self) -> _Caps:
        if self.mat is None:
            return self
        m = self.mat != 0
        return _Caps(ids=self.mat[m], lens=m.sum(1).astype(np.int64))



def _to_numpy(x: Any) -> Any:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        return x.detach().cpu().numpy()
    return x


def _truncate(mat: np.ndarray) -> np.ndarray:
    """Zero every id after a caption's first 0 (a caption ends at its first 0)."""
    if mat.size:
        mat = mat * np.minimum.accumulate(mat != 0, axis=1)
    return mat


def _int_matrix(a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype.kind not in "iu":
        raise TypeError(f"{what}: token ids must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and a.min() < 0:
        raise ValueError(f"{what}: token ids must be >= 0 (0 ends a caption)")
    return _truncate(a)


def _caps_from(x: Any, table: _WordTable | None, what: str) -> _Caps:
    """One list of captions: (C, T) ints, a list of token-id lists, or a list of strings."""
    x = _to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.ndim == 1 and x.size == 0:
            return _Caps(mat=np.zeros((0, 1), np.int64))
        if x.ndim != 2:
            raise ValueError(f"{what}: expected a (captions, T) id array, got shape {x.shape}")
        return _Caps(mat=_int_matrix(x, what))
    x = list(x)
    if not x:
        return _Caps(mat=np.zeros((0, 1), np.int64))
    if isinstance(x[0], str):
        if table is None:
            raise TypeError(f"{what}: string captions need a word table (mix of strings and ids?)")
        if not all(isinstance(c, str) for c in x):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
        return _encode_strings(x, table)
    else:
        seqs = [np.asarray(_to_numpy(s)).ravel().tolist() for s in x]
        if any(isinstance(t, str) for s in seqs[:1] for t in s):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
    lens = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    ids = np.fromiter((t for s in seqs for t in s), np.int64, int(lens.sum()))
    if ids.size and ids.min() < 0:
        raise ValueError(f"{what}: token ids must be >= 0 (0 ends a caption)")
    if ids.size and (ids == 0).any():  # honour "a caption ends at its first 0"
        return _Caps(mat=_pad(ids, lens)).ragged()
    return _Caps(ids=ids, lens=lens)


def _pad(ids: np.ndarray, lens: np.ndarray) -> np.ndarray:
    T = max(1, int(lens.max()) if lens.size else 1)
    mat = np.zeros((len(lens), T), np.int64)
    mat[np.arange(T) < lens[:, None]] = ids
    return _truncate(mat)


def _sets_from(refs: Any, table: _WordTable | None, what: str) -> tuple[_Caps, np.ndarray]:
    """A list of caption sets -> all captions (concatenated) and the number per set."""
    refs = _to_numpy(refs)
    if isinstance(refs, np.ndarray) and refs.ndim == 3:
        n, k, t = refs.shape
        return _Caps(mat=_int_matrix(refs.reshape(n * k, t), what)), np.full(n, k, np.int64)
    refs = list(refs)
    if refs and all(isinstance(r, np.ndarray) and r.ndim == 2 for r in refs) \
            and len({r.shape[1] for r in refs}) == 1:  # equal-width id arrays: one concatenation
        counts = np.fromiter((len(r) for r in refs), np.int64, len(refs))
        return _Caps(mat=_int_matrix(np.concatenate(refs), what)), counts
    if table is not None and all(isinstance(r, (list, tuple)) and (not r or isinstance(r[0], str)) for r in refs):
        counts = np.fromiter(map(len, refs), np.int64, len(refs))
        flat = [c for r in refs for c in r]
        if not all(map(str.__instancecheck__, flat)):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
        return _encode_strings(flat, table), counts
    sets = [_caps_from(r, table, f"{what}[{i}]") for i, r in enumerate(refs)]
    counts = np.array([len(s) for s in sets], np.int64)
    if all(s.mat is not None for s in sets):
        T = max((s.mat.shape[1] for s in sets), default=1)
        mats = [np.pad(s.mat, ((0, 0), (0, T - s.mat.shape[1]))) if s.mat.shape[1] < T else s.mat for s in sets]
        return _Caps(mat=np.concatenate(mats) if mats else np.zeros((0, 1), np.int64)), counts
    rag = [s.ragged() for s in sets]
    ids = np.concatenate([r.ids for r in rag]) if rag else np.zeros(0, np.int64)
    lens = np.concatenate([r.lens for r in rag]) if rag else np.zeros(0, np.int64)
    return _Caps(ids=ids, lens=lens), counts


def _encode_strings(strings: Sequence[str], table: _WordTable) -> _Caps:
    """Whitespace-split strings (as coco-caption's ``precook``) -> ragged ids, with C-level string
    work; the Python-level loop runs over distinct words only."""
    strings = list(strings)
    if not all(map(str.__instancecheck__, strings)):  # isinstance(x, str) for each, at C speed
        raise TypeError("a caption is either a string or a list of token ids")
    sep = "\x00"  # joined with a separator word, one split gives every caption's words and length
    joined = f" {sep} ".join(strings)
    ids = table.ids
    if joined.count(sep) != max(len(strings) - 1, 0):  # a caption holds the separator itself
        lens = np.fromiter(map(len, map(str.split, strings)), np.int64, len(strings))
        words = " ".join(strings).split()
        for w in dict.fromkeys(words):
            if w not in ids:
                table.add(w)
        return _Caps(ids=np.fromiter(map(ids.__getitem__, words), np.int64, len(words)), lens=lens)
    words = joined.split()
    for w in dict.fromkeys(words):
        if w not in ids and w != sep:
            table.add(w)
    ids[sep] = 0
    try:
        arr = np.fromiter(map(ids.__getitem__, words), np.int64, len(words))
    finally:
        del ids[sep]
    marks = np.flatnonzero(arr == 0)
    lens = np.diff(np.concatenate([[-1], marks, [len(arr)]])) - 1
    return _Caps(ids=arr[arr != 0], lens=lens.astype(np.int64))


def _has_strings(x: Any) -> bool:
    x = _to_numpy(x)
    if isinstance(x, np.ndarray) or isinstance(x, str):
        return isinstance(x, str)
    for item in x:
        item = _to_numpy(item)
        if isinstance(item, str):
            return True
        if isinstance(item, np.ndarray):
            return False
        if isinstance(item, (list, tuple)):
            for y in item:
                return isinstance(y, str) or (isinstance(y, (list, tuple)) and bool(y) and isinstance(y[0], str))
            continue
        return False
    return False


class _WordTable:
    """word -> id; ``frozen`` ids come from a vocabulary, new words get the next free ids."""

    def __init__(self, words: Sequence[str] = (), base: int = 1) -> None:
        self.ids: dict[str, int] = {w: i + 1 for i, w in enumerate(words)}
        self.next = max(base, len(self.ids) + 1)

    def add(self, w: str) -> int:
        i = self.ids.get(w)
        if i is None:
            i = self.ids[w] = self.next
            self.next += 1
        return i

    def words(self) -> list[str]:
        words = [""] * (self.next - 1)
        for w, i in self.ids.items():
            words[i - 1] = w
        return words


# ----------------------------------------------------------------------------------------------
# exact hash table for document frequencies
# ----------------------------------------------------------------------------------------------

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_GOLD2 = np.uint64(0xC2B2AE3D27D4EB4F)
_BYTE_INDEX4 = np.uint32(0x00010203)


def _aligned(shape: tuple[int, int], fill: int, align: int = 64) -> np.ndarray:
    """An int64 array whose rows start on ``align``-byte boundaries (a bucket = a cache line)."""
    n = shape[0] * shape[1]
    buf = np.full(n + align // 8, fill, np.int64)
    off = (-buf.ctypes.data % align) // 8
    return buf[off:off + n].reshape(shape)


class _ExactHash:
    """Exact hash table from int64 keys to float64 values.

    A bucket is one 64-byte cache line: 4 keys and their 4 values (two lines with two-word keys),
    so a lookup reads one line of memory however large the table.
    Linear probing over buckets; built and queried in vectorized rounds (most queries end in their
    first bucket). Keys are int64 >= 0, or pairs of them (shape (K, 2)); a lookup compares the
    whole key, so it is exact. Missing keys give 0.0. Load 0.3 to 0.6 (27-53 bytes per key).
    """

    WIDTH = 4

    def __init__(self, keys: np.ndarray, values: np.ndarray) -> None:
        self.two = keys.ndim == 2
        K, W = len(keys), self.WIDTH
        bits = max(1, int(math.ceil(math.log2(max(K / (0.6 * W), 2)))))  # load 0.3 to 0.6
        nb = 1 << bits
        self.mask = nb - 1
        self.shift = np.uint64(64 - bits)
        self.nk = 2 * W if self.two else W  # key columns; then W value columns
        self.cols = 16 if self.two else 8  # (4 key pairs + 4 values + 4 unused) or (4 + 4)
        self.table = _aligned((nb, self.cols), -1)
        flat_t = self.table.reshape(-1)
        vals = np.ascontiguousarray(values, np.float64).view(np.int64)
        fill = np.zeros(nb, np.int64)
        b, pending = self._grouped(self._hash(keys), np.arange(K, dtype=np.int64))  # keys grouped by bucket
        r = 0
        while pending.size:
            # rank of each key among the pending keys of its bucket (they are contiguous)
            new = np.empty(len(b), bool)
            new[0] = True
            np.not_equal(b[1:], b[:-1], out=new[1:])
            start = np.flatnonzero(new)
            rank = np.arange(len(b)) - np.repeat(start, np.diff(np.append(start, len(b))))
            cell = fill[b] + rank
            fits = cell < W
            pk, bb, cc = pending[fits], b[fits], cell[fits]
            base = bb * self.cols
            if self.two:
                flat_t[base + 2 * cc], flat_t[base + 2 * cc + 1] = keys[pk, 0], keys[pk, 1]
            else:
                flat_t[base + cc] = keys[pk]
            flat_t[base + self.nk + cc] = vals[pk]
            fill += np.bincount(bb, minlength=nb)
            if fits.all():
                break
            # the rest go on to the next bucket (regrouped: wrapping around breaks the order)
            b, pending = self._grouped((b[~fits] + 1) & self.mask, pending[~fits])
            r += 1
        self.full = fill == W
        self.max_probe = r + 1

    @staticmethod
    def _grouped(b: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(b, idx)`` ordered by bucket, with one packed int64 sort (bucket << 32 | position)."""
        if len(b) == 0:
            return b, idx
        packed = np.sort((b << 32) | np.arange(len(b), dtype=np.int64))
        return packed >> 32, idx[packed & 0xFFFFFFFF]

    def _hash(self, keys: np.ndarray) -> np.ndarray:
        # integer arrays wrap around silently: multiplicative hashing, top bits
        if self.two:
            x = (keys[:, 0].astype(np.uint64) * _GOLD ^ keys[:, 1].astype(np.uint64) * _GOLD2) * _GOLD
        else:
            x = keys.astype(np.uint64) * _GOLD
        return (x >> self.shift).astype(np.int64)

    def _probe(self, q: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One round: (hit mask, values of the hits, mask of misses that must look further)."""
        W = self.WIDTH
        lines = np.take(self.table, b, axis=0)  # (Q, cols): one cache line per query
        if self.two:
            eq = (lines[:, 0:2 * W:2] == q[:, :1]) & (lines[:, 1:2 * W:2] == q[:, 1:])
        else:
            eq = lines[:, :W] == q[:, None]
        word = np.ascontiguousarray(eq).view(np.uint32).reshape(-1)  # 4 match flags, one byte each
        hit = word != 0
        # a hit has a single byte j set: word * 0x00010203 carries j into the top byte
        idx = ((word[hit] * _BYTE_INDEX4) >> np.uint32(24)).astype(np.int64)
        pos = np.flatnonzero(hit) * self.cols + self.nk + idx
        return hit, np.take(lines.reshape(-1), pos).view(np.float64), ~hit & np.take(self.full, b)

    def get(self, q: np.ndarray) -> np.ndarray:
        """The value of each query key (0.0 when absent)."""
        out = np.zeros(len(q), np.float64)
        b = self._hash(q)
        hit, vals, cont = self._probe(q, b)
        out[hit] = vals
        pend = np.flatnonzero(cont)
        for _ in range(1, self.max_probe):  # the few queries whose bucket was full
            if not pend.size:
                break
            b = (b[cont] + 1) & self.mask
            hit, vals, cont = self._probe(q[pend], b)
            out[pend[hit]] = vals
            pend = pend[cont]
        return out


# ----------------------------------------------------------------------------------------------
# n-gram keys <-> digits
# ----------------------------------------------------------------------------------------------

def _digits(keys: np.ndarray, base: int) -> np.ndarray:
    """(Q,) base-``base`` keys -> (Q, 4) digits, least significant first (0 beyond the order)."""
    d = np.empty((len(keys), N_ORDER), np.int64)
    k = keys.copy()
    for i in range(N_ORDER):
        d[:, i] = k % base
        k //= base
    return d


def _reverse_prefix(a: np.ndarray) -> np.ndarray:
    """Reverse the non-zero prefix of each row: (t1..tn, 0..) <-> (tn..t1, 0..)."""
    a = np.asarray(a, np.int64)
    order = (a != 0).sum(1, keepdims=True)
    idx = order - 1 - np.arange(N_ORDER)[None, :]
    return np.where(idx >= 0, np.take_along_axis(a, np.maximum(idx, 0), 1), 0)


def _tuples_to_digits(ngrams: np.ndarray) -> np.ndarray:
    """(K, 4) n-grams (t1..tn, right-padded with 0) -> digits least significant first."""
    return _reverse_prefix(ngrams)


def _digits_to_tuples(d: np.ndarray) -> np.ndarray:
    return _reverse_prefix(d)


def _keys_to_tuples(keys: np.ndarray, base: int) -> np.ndarray:
    """(Q,) base-``base`` keys -> (Q, 4) tuples t1..tn right-padded with 0: scaling a key by
    ``base^(4-n)`` left-aligns its digits, which are then read most significant first."""
    order = 1 + (keys >= base) + (keys >= base ** 2) + (keys >= base ** 3)
    scaled = keys * np.array([0, base ** 3, base ** 2, base, 1], np.int64)[order]
    t = np.empty((len(keys), N_ORDER), np.int64)
    for i in range(N_ORDER):
        t[:, i] = scaled // base ** (N_ORDER - 1 - i) % base
    return t


def _encode_digits(d: np.ndarray, base: int) -> np.ndarray:
    k = np.zeros(len(d), np.int64)
    for i in range(N_ORDER - 1, -1, -1):
        k = k * base + d[:, i]
    return k


# ----------------------------------------------------------------------------------------------
# document frequencies
# ----------------------------------------------------------------------------------------------

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
        self._hash: _ExactHash | None = None

    @property
    def ngrams(self) -> np.ndarray:
        """(K, 4) int64: each n-gram's ids t1..tn, right-padded with 0."""
        if self._ngrams is None:
            if self._keys is not None:
                self._ngrams = _keys_to_tuples(self._keys, self._keys_base)
            else:
                self._ngrams = _digits_to_tuples(self._digits)
        return self._ngrams

    @property
    def digits(self) -> np.ndarray:
        """(K, 4) int64: each n-gram's ids last word first (tn..t1), right-padded with 0."""
        if self._digits is None:
            if self._keys is not None:
                self._digits = _digits(self._keys, self._keys_base)
            else:
                self._digits = _tuples_to_digits(self._ngrams)
        return self._digits

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

        if len(self.ngrams) and self.ngrams.max() > np.iinfo(np.int32).max:
            raise ValueError("DocFreq.save_h5: ids do not fit int32")
        with h5py.File(path, "w") as f:
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
        if _has_strings(refs):
            table = _WordTable(words or ())
        caps, counts = _sets_from(refs, table, "references")
        return cls._from_caps(caps, counts, table.words() if table is not None else words)

    @classmethod
    def _from_caps(cls, caps: _Caps, counts: np.ndarray, words: Sequence[str] | None,
                   base: int = 0) -> DocFreq:
        if len(counts) == 0:
            raise ValueError("DocFreq.from_references: no reference sets")
        base = max(base, caps.max_id() + 1, (len(words) + 1) if words else 0, 2)
        keys_all = []
        for lo, hi, slot_index in _set_chunks(counts):
            flat, _, _ = _layout(caps, slot_index)
            keys, _ = _row_grams(flat, base)
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

    def _table(self) -> _ExactHash:
        if self._hash is None:
            if self.base <= _MAX_BASE:
                if self._keys is not None and self._keys_base == self.base:
                    keys = self._keys
                elif self._ngrams is not None:  # Horner over the ids, skipping the 0 padding
                    keys = np.zeros(len(self._ngrams), np.int64)
                    for i in range(N_ORDER):
                        t = self._ngrams[:, i]
                        keys = np.where(t != 0, keys * self.base + t, keys)
                else:
                    keys = _encode_digits(self._digits, self.base)
            else:
                d = self.digits
                keys = np.stack([(d[:, 0] << 31) | d[:, 1], (d[:, 2] << 31) | d[:, 3]], 1)
            self._hash = _ExactHash(keys, self.df)
        return self._hash

    def lookup_digits(self, d: np.ndarray, log: bool = False) -> np.ndarray:
        """df of n-grams given as (Q, 4) ids, least significant (last word) first, 0-padded
        (``log``: ``log(max(1, df))`` instead)."""
        table = self._table()
        if self.base <= _MAX_BASE:
            unknown = (d >= self.base).any(1)
            keys = _encode_digits(np.where(unknown[:, None], 0, d), self.base)
            out = table.get(keys)
            out[unknown] = 0.0
        else:
            out = table.get(np.stack([(d[:, 0] << 31) | d[:, 1], (d[:, 2] << 31) | d[:, 3]], 1))
        return np.log(np.maximum(out, 1.0)) if log else out

    def lookup(self, ngrams: np.ndarray) -> np.ndarray:
        """df of n-grams given as (Q, 4) ids t1..tn right-padded with 0 (0.0 when absent)."""
        return self.lookup_digits(_tuples_to_digits(np.asarray(ngrams, np.int64).reshape(-1, N_ORDER)))

    def _log_df_of_keys(self, keys: np.ndarray, base: int, relabel: np.ndarray | None) -> np.ndarray:
        """``log(max(1, df))`` of n-grams given as keys in ``base`` (of relabelled ids)."""
        if relabel is None and base == self.base:
            return np.log(np.maximum(self._table().get(keys), 1.0))  # absent: log(max(1, 0)) = 0
        d = _digits(keys, base)
        if relabel is not None:
            d = relabel[d]
        return self.lookup_digits(d, log=True)


# ----------------------------------------------------------------------------------------------
# layout: captions that are compared share one row per (group, n)
# ----------------------------------------------------------------------------------------------

def _layout(caps: _Caps, slot_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows of captions: ``slot_index`` (G, S) holds caption indices (-1: empty slot).

    Returns ``flat`` (G, L) ids with at least one 0 between captions, ``slot`` (1 or G, L) the slot
    of each position, and S.
    """
    G, S = slot_index.shape
    if caps.mat is not None:
        T = caps.mat.shape[1]
        rows = np.zeros((G, S, T + 1), np.int64)  # a 0 column ends every caption
        rows[:, :, :T] = caps.mat[np.maximum(slot_index, 0)]
        rows[slot_index < 0] = 0
        slot = (np.arange(S * (T + 1)) // (T + 1))[None, :]
        return rows.reshape(G, S * (T + 1)), slot, S
    lens = np.append(caps.lens, 0)[slot_index]  # (G, S)
    width = lens + 1
    start = np.cumsum(width, axis=1) - width
    L = max(int(width.sum(1).max()) if G else 1, 1)
    flat = np.zeros((G, L), np.int64)
    slot = np.zeros((G, L), np.int64)
    occ = slot_index >= 0
    g_occ, s_occ = np.nonzero(occ)
    c_occ = slot_index[occ]
    n_occ = caps.lens[c_occ]
    cstart = np.cumsum(caps.lens) - caps.lens
    rep = np.repeat(np.arange(len(c_occ)), n_occ)
    within = np.arange(int(n_occ.sum())) - np.repeat(np.cumsum(n_occ) - n_occ, n_occ)
    pos = start[g_occ, s_occ][rep] + within
    flat[g_occ[rep], pos] = caps.ids[cstart[c_occ][rep] + within]
    slot[g_occ[rep], pos] = s_occ[rep]
    return flat, slot, S


def _relabel(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Map the ids used in ``flat`` to 1..U (0 stays 0); returns new ids, the map back, base."""
    uniq, inv = np.unique(flat, return_inverse=True)
    if uniq[0] != 0:
        uniq = np.concatenate([[0], uniq])
        inv = inv + 1
    return inv.reshape(flat.shape).astype(np.int64), uniq, len(uniq)


def _row_grams(flat: np.ndarray, base: int) -> tuple[np.ndarray, int]:
    """Distinct n-grams of each row (for document frequencies): keys in ``base``, or digit tuples
    of the original ids when the ids had to be relabelled."""
    relabel = None
    if base > _MAX_BASE:
        flat, relabel, base = _relabel(flat)
        if base > _MAX_BASE:
            raise ValueError("more than 55,107 distinct words in one group of captions")
    G, L = flat.shape
    rows = np.full((G, N_ORDER, L), _SENT, np.int64)
    nz = flat != 0
    key, valid = flat, nz
    for n in range(min(N_ORDER, L)):
        if n:
            key = key[:, :-1] * base + flat[:, n:]
            valid = valid[:, :-1] & nz[:, n:]
        rows[:, n, :L - n] = np.where(valid, key, _SENT)
    rows.sort(axis=-1)
    new = rows != _SENT
    new[..., 1:] &= rows[..., 1:] != rows[..., :-1]
    keys = rows[new]
    if relabel is not None:
        return relabel[_digits(keys, base)], base
    return keys, base


def _set_chunks(counts: np.ndarray):
    """Groups = reference sets (slots = their captions), in chunks of bounded size."""
    n = len(counts)
    k = int(counts.max()) if n else 1
    per = max(1, _CHUNK_ELEMS // max(1, k * 64))
    starts = np.cumsum(counts) - counts
    for lo in range(0, n, per):
        hi = min(n, lo + per)
        idx = starts[lo:hi, None] + np.arange(k)[None, :]
        idx = np.where(np.arange(k)[None, :] < counts[lo:hi, None], idx, -1)
        yield lo, hi, idx


def _group_chunks(caps: _Caps, slot_index: np.ndarray):
    """Chunks of groups (rows of ``slot_index``) of similar width, each of bounded size."""
    G, S = slot_index.shape
    if caps.mat is not None:
        widths = np.full(G, S * (caps.mat.shape[1] + 1), np.int64)
        order = np.arange(G)
    else:
        widths = (np.append(caps.lens, 0)[slot_index] + 1).sum(1)
        order = np.argsort(widths, kind="stable")
    cost = N_ORDER * S
    i = 0
    while i < G:
        n = max(1, _CHUNK_ELEMS // (cost * int(widths[order[i]])))
        end = min(G, i + n)
        n = max(1, _CHUNK_ELEMS // (cost * int(widths[order[end - 1]])))
        end = min(G, i + n)
        yield order[i:end]
        i = end


# ----------------------------------------------------------------------------------------------
# the kernel
# ----------------------------------------------------------------------------------------------

def _sorted_rows(flat: np.ndarray, slot: np.ndarray, base: int, sb: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every valid n-gram occurrence as (key, slot), sorted by (row = group * 4 + n, key, slot).

    Returns the flattened keys and slots (invalid windows dropped) and the end of each row in them;
    when keys and slots fit one int64 together, the first array holds ``key << sb | slot`` and the
    second is None.
    """
    G, L = flat.shape
    pack = base ** N_ORDER < (1 << (63 - sb))
    nz = flat != 0
    rows = np.full((G, N_ORDER, L), _SENT, np.int64)
    slots = None if pack else np.zeros((G, N_ORDER, L), np.int64)
    key, valid = flat, nz
    for n in range(min(N_ORDER, L)):  # a row shorter than n holds no n-gram
        if n:
            key = key[:, :-1] * base + flat[:, n:]
            valid = valid[:, :-1] & nz[:, n:]
        s_n = slot[:, :L - n]
        if pack:
            np.copyto(rows[:, n, :L - n], (key << sb) | s_n, where=valid)
        else:
            rows[:, n, :L - n] = np.where(valid, key, _SENT)
            slots[:, n, :L - n] = s_n
    if pack:  # keys and slots packed in one int64: the runs of equal values are the postings
        rows.sort(axis=-1)
        ok = rows != _SENT
        return rows[ok], None, np.cumsum(ok.sum(-1).ravel())
    order = np.argsort(rows, axis=-1, kind="stable")
    rows = np.take_along_axis(rows, order, -1)
    ok = rows != _SENT
    return rows[ok], np.take_along_axis(slots, order, -1)[ok], np.cumsum(ok.sum(-1).ravel())


@dataclass
class Postings:
    """The n-grams of rows of captions (a row = an image's captions in slots), as postings: one
    caption's count of one n-gram. Postings are ordered by (row, n-gram, slot), where a row is
    ``image * 4 + (n - 1)``; the postings of one n-gram in one row form a contiguous "gram" group.
    """

    row: np.ndarray  # (P,) image * 4 + (n - 1)
    slot: np.ndarray  # (P,) caption slot within the image
    count: np.ndarray  # (P,) float64 occurrences of the n-gram in that caption
    gram: np.ndarray  # (P,) index of the posting's gram group
    gram_start: np.ndarray  # (Q,) first posting of each gram group
    gram_key: np.ndarray  # (Q,) the n-gram's key (base ``base`` digits of ids, maybe relabelled)
    base: int
    relabel: np.ndarray | None  # relabelled id -> original id, when ids had to be relabelled


def _postings(flat: np.ndarray, slot: np.ndarray, S: int, base: int) -> Postings:
    relabel = None
    if base > _MAX_BASE:
        flat, relabel, base = _relabel(flat)
        if base > _MAX_BASE:
            raise ValueError("more than 55,107 distinct words in one group of captions")
    sb = max(1, (S - 1).bit_length())
    keys, slots, row_end = _sorted_rows(flat, slot, base, sb)
    nocc = keys.size
    if nocc == 0:
        e = np.zeros(0, np.int64)
        return Postings(e, e, np.zeros(0), e, e, e, base, relabel)
    # a posting starts where (key, slot) changes or a new row (image, n) begins
    bound = np.empty(nocc, bool)
    bound[0] = True
    if slots is None:
        np.not_equal(keys[1:], keys[:-1], out=bound[1:])
    else:
        np.logical_or(keys[1:] != keys[:-1], slots[1:] != slots[:-1], out=bound[1:])
    bound[row_end[:-1][row_end[:-1] < nocc]] = True
    pstart = np.flatnonzero(bound)
    pcount = np.diff(np.append(pstart, nocc)).astype(np.float64)
    if slots is None:
        pv = keys[pstart]
        pkey, pslot = pv >> sb, pv & ((1 << sb) - 1)
    else:
        pkey, pslot = keys[pstart], slots[pstart]
    occ_per_row = np.diff(np.concatenate([[0], row_end]))
    prow = np.repeat(np.arange(len(row_end)), occ_per_row)[pstart]  # row (image, n) of each posting
    gnew = np.empty(len(pkey), bool)
    gnew[0] = True
    np.logical_or(pkey[1:] != pkey[:-1], prow[1:] != prow[:-1], out=gnew[1:])
    gstart = np.flatnonzero(gnew)
    return Postings(prow, pslot, pcount, np.cumsum(gnew) - 1, gstart, pkey[gstart], base, relabel)


def ngram_postings(captions: Any) -> tuple[Postings, int, int]:
    """Postings of B images with M captions each ((B, M, T) ids, or B lists of M strings or id
    lists); returns ``(postings, B, M)``. For statistics over an image's captions (Div-n, mBLEU)."""
    table = _WordTable() if _has_strings(captions) else None
    caps, counts = _sets_from(captions, table, "captions")
    B = len(counts)
    M = int(counts.max()) if B else 0
    if B and (counts != M).any():
        raise ValueError("every image needs the same number of captions")
    base = max(caps.max_id() + 1, table.next if table is not None else 0, 2)
    slot_index = np.arange(B * M, dtype=np.int64).reshape(B, M)
    flat, slot, _ = _layout(caps, slot_index)
    return _postings(flat, slot, max(M, 1), base), B, M


def _pair_scores(post: Postings, gram_idf: np.ndarray, lens: np.ndarray, S: int, k: int, sigma: float,
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


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------

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

    def _table(self, strings: bool) -> _WordTable | None:
        if not strings:
            return None
        if self.df is None:
            return _WordTable()
        if self.df.words is None:
            raise TypeError("this DocFreq has no word list: pass token ids, or build it with words "
                            "(DocFreq.from_h5 next to vocab.json, or from_references on strings)")
        return _WordTable(self.df.words, base=self.df.base)

    def _base(self, *caps: _Caps, table: _WordTable | None) -> int:
        base = max([c.max_id() + 1 for c in caps] + [table.next if table is not None else 0, 2])
        return max(base, self.df.base) if self.df is not None else base

    def _run(self, caps: _Caps, slot_index: np.ndarray, k: int, base: int, *, doc_slots: int,
             doc_groups: np.ndarray | None, num_docs: int, clipped: bool, vs_refs: bool, vs_self: bool):
        """Score the rows of ``slot_index`` chunk by chunk; yields ``(rows, to_refs, to_self)``.

        Corpus mode (no fixed df): a first pass collects every chunk's postings, and the document
        frequency of an n-gram is the number of documents -- rows in ``doc_groups`` (None: all),
        counting slots ``< doc_slots`` -- that contain it; ``num_docs`` documents in all.
        """
        S = slot_index.shape[1]
        cap_lens = np.append(caps.word_counts(), 0)  # index -1 (an empty slot) -> 0 words
        chunks = []
        for rows in _group_chunks(caps, slot_index):
            flat, slot, _ = _layout(caps, slot_index[rows])
            post = _postings(flat, slot, S, base)
            lens = cap_lens[slot_index[rows]]
            if self.df is not None:
                idf = self.df.ref_len - self.df._log_df_of_keys(post.gram_key, post.base, post.relabel)
                yield (rows, *_pair_scores(post, idf, lens, S, k, self.sigma, clipped, vs_refs, vs_self))
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
            if post.relabel is not None or base > _MAX_BASE:  # canonical two-word keys of original ids
                d = _digits(key, post.base)
                d = post.relabel[d] if post.relabel is not None else d
                key = np.stack([(d[:, 0] << 31) | d[:, 1], (d[:, 2] << 31) | d[:, 3]], 1)
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
            yield (rows, *_pair_scores(post, idf_all[lo:hi], lens, S, k, self.sigma, clipped, vs_refs, vs_self))
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
        strings = _has_strings(hyps) or _has_strings(refs)
        table = self._table(strings)
        rcaps, counts = _sets_from(refs, table, "refs")
        hcaps = _caps_from(hyps, table, "hyps")
        H, N = len(hcaps), len(counts)
        if ref_index is None:
            if H != N:
                raise ValueError(f"{H} hypotheses but {N} reference sets; pass ref_index")
            ref_index = np.arange(H)
        ref_index = np.asarray(_to_numpy(ref_index), np.int64).reshape(-1)
        if len(ref_index) != H:
            raise ValueError(f"ref_index has {len(ref_index)} entries for {H} hypotheses")
        if H and (ref_index.min() < 0 or ref_index.max() >= N):
            raise ValueError(f"ref_index out of range for {N} reference sets")
        used = np.bincount(ref_index, minlength=N) > 0
        if (counts[used] == 0).any():
            raise ValueError("a reference set scored against is empty")
        if H == 0:
            return np.zeros(0, np.float64)
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
        out_g = np.zeros((G, m_cap))
        for rows, pair, _ in self._run(_concat(rcaps, hcaps), slot_index, k_max, base, doc_slots=k_max,
                                       doc_groups=first, num_docs=N, clipped=True, vs_refs=True, vs_self=False):
            out_g[rows] = pair.sum(-1)
        out = np.empty(H)
        out[order] = out_g[grp, hslot] / counts[sset]
        return out

    def pairwise(self, caps: Any, kind: str = "cider-d") -> np.ndarray:
        """Similarity matrices of the m captions of each image: (B, M, M) float64.

        ``caps``: (B, M, T) int array or a list of B lists of M captions (strings or id lists).
        ``kind="cider-d"``: ``K[b,i,j]`` = CIDEr-D of caption i against the single reference j for
        i <= j, mirrored to the lower triangle (DESIGN §4). ``kind="cider"``: plain CIDEr (cosine
        of the tf-idf vectors, no clipping, no length penalty), which is symmetric.
        With ``df=None`` each image's M captions form one document.
        """
        if kind not in ("cider-d", "cider"):
            raise ValueError(f"unknown kind {kind!r}; use 'cider-d' or 'cider'")
        strings = _has_strings(caps)
        table = self._table(strings)
        allc, counts = _sets_from(caps, table, "caps")
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
        strings = _has_strings(caps) or _has_strings(refs)
        table = self._table(strings)
        hcaps, hcounts = _sets_from(caps, table, "caps")
        rcaps, counts = _sets_from(refs, table, "refs")
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
        for rows, to_refs, to_self in self._run(_concat(rcaps, hcaps), slot_index, k, base, doc_slots=k,
                                                doc_groups=None, num_docs=B, clipped=True, vs_refs=True,
                                                vs_self=True):
            q[rows] = to_refs.sum(-1) / counts[rows, None]
            K[rows] = to_self
        return q, _mirror(K)


def _mirror(K: np.ndarray) -> np.ndarray:
    """Copy the upper triangle of each (M, M) matrix to its lower triangle, in place."""
    i, j = np.triu_indices(K.shape[-1], 1)
    K[:, j, i] = K[:, i, j]
    return K


def _concat(a: _Caps, b: _Caps) -> _Caps:
    if a.mat is not None and b.mat is not None:
        if a.mat.shape[1] == b.mat.shape[1]:
            return _Caps(mat=np.concatenate([a.mat, b.mat]))
        out = np.zeros((len(a.mat) + len(b.mat), max(a.mat.shape[1], b.mat.shape[1])), np.int64)
        out[:len(a.mat), :a.mat.shape[1]] = a.mat
        out[len(a.mat):, :b.mat.shape[1]] = b.mat
        return _Caps(mat=out)
    ra, rb = a.ragged(), b.ragged()
    return _Caps(ids=np.concatenate([ra.ids, rb.ids]), lens=np.concatenate([ra.lens, rb.lens]))
