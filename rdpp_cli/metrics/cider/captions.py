"""Captions in every form a caller passes them -> token ids, the one form the rest works on.

Why: users score strings (coco-caption style), training passes (B, M, T) tensors of ids, tests pass
lists of id lists. Everything past this file sees only :class:`Caps`: a padded (C, T) int64 matrix
(0 after the end) or ragged ids with lengths.

What it guarantees: a caption ends at its first 0 (ids after it are ignored); strings are split on
whitespace exactly like coco-caption's ``precook``, through a :class:`WordTable` that gives
vocabulary words their vocabulary ids and new words fresh ids past it; ids must be integers >= 0
and a caption is either a string or ids, never a mix (TypeError / ValueError otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Caps:
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

    def ragged(self) -> Caps:
        if self.mat is None:
            return self
        m = self.mat != 0
        return Caps(ids=self.mat[m], lens=m.sum(1).astype(np.int64))


def concat(a: Caps, b: Caps) -> Caps:
    """The captions of ``a`` then those of ``b``, as one list."""
    if a.mat is not None and b.mat is not None:
        if a.mat.shape[1] == b.mat.shape[1]:
            return Caps(mat=np.concatenate([a.mat, b.mat]))
        out = np.zeros((len(a.mat) + len(b.mat), max(a.mat.shape[1], b.mat.shape[1])), np.int64)
        out[:len(a.mat), :a.mat.shape[1]] = a.mat
        out[len(a.mat):, :b.mat.shape[1]] = b.mat
        return Caps(mat=out)
    ra, rb = a.ragged(), b.ragged()
    return Caps(ids=np.concatenate([ra.ids, rb.ids]), lens=np.concatenate([ra.lens, rb.lens]))


def to_numpy(x: Any) -> Any:
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


def caps_from(x: Any, table: WordTable | None, what: str) -> Caps:
    """One list of captions: (C, T) ints, a list of token-id lists, or a list of strings."""
    x = to_numpy(x)
    if isinstance(x, np.ndarray):
        if x.ndim == 1 and x.size == 0:
            return Caps(mat=np.zeros((0, 1), np.int64))
        if x.ndim != 2:
            raise ValueError(f"{what}: expected a (captions, T) id array, got shape {x.shape}")
        return Caps(mat=_int_matrix(x, what))
    x = list(x)
    if not x:
        return Caps(mat=np.zeros((0, 1), np.int64))
    if isinstance(x[0], str):
        if table is None:
            raise TypeError(f"{what}: string captions need a word table (mix of strings and ids?)")
        if not all(isinstance(c, str) for c in x):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
        return _encode_strings(x, table)
    else:
        seqs = [np.asarray(to_numpy(s)).ravel().tolist() for s in x]
        if any(isinstance(t, str) for s in seqs[:1] for t in s):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
    lens = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
    ids = np.fromiter((t for s in seqs for t in s), np.int64, int(lens.sum()))
    if ids.size and ids.min() < 0:
        raise ValueError(f"{what}: token ids must be >= 0 (0 ends a caption)")
    if ids.size and (ids == 0).any():  # honour "a caption ends at its first 0"
        return Caps(mat=_pad(ids, lens)).ragged()
    return Caps(ids=ids, lens=lens)


def _pad(ids: np.ndarray, lens: np.ndarray) -> np.ndarray:
    T = max(1, int(lens.max()) if lens.size else 1)
    mat = np.zeros((len(lens), T), np.int64)
    mat[np.arange(T) < lens[:, None]] = ids
    return _truncate(mat)


def sets_from(refs: Any, table: WordTable | None, what: str) -> tuple[Caps, np.ndarray]:
    """A list of caption sets -> all captions (concatenated) and the number per set."""
    refs = to_numpy(refs)
    if isinstance(refs, np.ndarray) and refs.ndim == 3:
        n, k, t = refs.shape
        return Caps(mat=_int_matrix(refs.reshape(n * k, t), what)), np.full(n, k, np.int64)
    refs = list(refs)
    if refs and all(isinstance(r, np.ndarray) and r.ndim == 2 for r in refs) \
            and len({r.shape[1] for r in refs}) == 1:  # equal-width id arrays: one concatenation
        counts = np.fromiter((len(r) for r in refs), np.int64, len(refs))
        return Caps(mat=_int_matrix(np.concatenate(refs), what)), counts
    if table is not None and all(isinstance(r, (list, tuple)) and (not r or isinstance(r[0], str)) for r in refs):
        counts = np.fromiter(map(len, refs), np.int64, len(refs))
        flat = [c for r in refs for c in r]
        if not all(map(str.__instancecheck__, flat)):
            raise TypeError(f"{what}: a caption is either a string or a list of token ids")
        return _encode_strings(flat, table), counts
    sets = [caps_from(r, table, f"{what}[{i}]") for i, r in enumerate(refs)]
    counts = np.array([len(s) for s in sets], np.int64)
    if all(s.mat is not None for s in sets):
        T = max((s.mat.shape[1] for s in sets), default=1)
        mats = [np.pad(s.mat, ((0, 0), (0, T - s.mat.shape[1]))) if s.mat.shape[1] < T else s.mat for s in sets]
        return Caps(mat=np.concatenate(mats) if mats else np.zeros((0, 1), np.int64)), counts
    rag = [s.ragged() for s in sets]
    ids = np.concatenate([r.ids for r in rag]) if rag else np.zeros(0, np.int64)
    lens = np.concatenate([r.lens for r in rag]) if rag else np.zeros(0, np.int64)
    return Caps(ids=ids, lens=lens), counts


def _encode_strings(strings: Sequence[str], table: WordTable) -> Caps:
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
        return Caps(ids=np.fromiter(map(ids.__getitem__, words), np.int64, len(words)), lens=lens)
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
    return Caps(ids=arr[arr != 0], lens=lens.astype(np.int64))


def has_strings(x: Any) -> bool:
    x = to_numpy(x)
    if isinstance(x, np.ndarray) or isinstance(x, str):
        return isinstance(x, str)
    for item in x:
        item = to_numpy(item)
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


class WordTable:
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

