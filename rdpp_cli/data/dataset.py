"""Read access to a data artifact: vocabulary, splits, features and references.

Reads only the rows asked for (COCO's att features are ~100 GB): every accessor takes image
indices (rows of captions.h5 / features.h5) and returns just those images. HDF5 handles are opened
lazily per process, so a ``DataArtifact`` can be handed to DataLoader workers; reads are safe from
several threads (the training loader's read-ahead). torch is imported only by the functions
that make or check tensors, so that `rdpp score` reads references without the trainer installed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import h5py
import numpy as np

from rdpp_cli.artifacts import Artifact, read_artifact
from rdpp_cli.artifacts.content_hash import row_extents
from rdpp_cli.data.vocab import decode_ids
from rdpp_cli.errors import RdppError

SPLITS = ("train", "val", "test")


def _first_difference(features: np.ndarray | None, captions: np.ndarray) -> str:
    if features is None:
        return "features.h5 has no image_ids"
    if len(features) != len(captions):
        return f"{len(features)} feature rows, {len(captions)} captioned images"
    i = int(np.flatnonzero(features != captions)[0])
    return f"row {i}: image {int(features[i])} in features.h5, {int(captions[i])} in captions.h5"


class DataArtifact:
    """A data artifact opened for reading (see docs/architecture.md for the files)."""

    def __init__(self, artifact: Artifact):
        if artifact.kind != "rdpp.data":
            raise RdppError(f"{artifact.path} is a {artifact.kind} artifact; expected a data artifact (rdpp.data)")
        self.artifact = artifact
        self.path = artifact.path
        for name in ("vocab.json", "captions.h5", "features.h5", "cider_df.h5"):
            artifact.file(name)  # size and sha256 against the manifest (hashed once per file version)
        self.words: list[str] = json.loads((self.path / "vocab.json").read_text())["words"]
        with h5py.File(self.path / "captions.h5", "r") as f:
            self.image_ids = f["image_ids"][:].astype(np.int64)
            self.split = np.array([s.decode() if isinstance(s, bytes) else str(s) for s in f["split"][:]])
            self.label_start = f["label_start"][:].astype(np.int64)
            self.label_end = f["label_end"][:].astype(np.int64)
            self.seq_length = int(f["labels"].shape[1])
        with h5py.File(self.path / "features.h5", "r") as f:
            self.fc_dim = int(f["fc"].shape[1])
            self.feature_dtype = np.dtype(f["att"].dtype)
            self.att_regions, self.att_dim = int(f["att"].shape[1]), int(f["att"].shape[2])
            self.has_att_len = "att_len" in f
            feature_ids = f["image_ids"][:].astype(np.int64) if "image_ids" in f else None
        if feature_ids is None or not np.array_equal(feature_ids, self.image_ids):
            raise RdppError(f"{self.path}: features.h5 and captions.h5 do not hold the same images in the same order "
                            f"({_first_difference(feature_ids, self.image_ids)}); the artifact is inconsistent: remake "
                            "it with `rdpp prepro toy` or `rdpp prepro coco`")
        self._handles: dict[str, h5py.File] = {}
        self._readers: dict[str, RowReader] = {}
        self._labels: np.ndarray | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def open(cls, path: Path | str) -> "DataArtifact":
        return cls(read_artifact(path, "rdpp.data"))

    # -- vocabulary -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of words; the model's output has vocab_size + 1 entries (0 = EOS)."""
        return len(self.words)

    def decode(self, ids) -> str:
        """Word ids (stopping at the first 0) → space-joined words."""
        return decode_ids(self.words, ids)

    # -- rows ---------------------------------------------------------------------------------
    def split_indices(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise RdppError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
        idx = np.flatnonzero(self.split == split)
        if len(idx) == 0:
            raise RdppError(f"data artifact {self.path} has no images in split '{split}'")
        return idx

    def _h5(self, name: str) -> h5py.File:
        with self._lock:
            if self._pid != os.getpid():  # forked into a worker: never share HDF5 handles
                self._handles, self._pid = {}, os.getpid()
            if name not in self._handles:
                self._handles[name] = h5py.File(self.path / name, "r")
            return self._handles[name]

    def _read(self, name: str, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        reader = self._readers.get(name)  # kept across fork: a worker inherits the row offsets
        if reader is None:
            ds = self._h5("features.h5")[name]
            with self._lock:
                reader = self._readers.setdefault(name, RowReader(ds, self.path / "features.h5"))
        return reader.read(idx, None if reader.direct else self._h5("features.h5")[name], out)

    def feature_rows(self, idx, out: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(fc (B, D), att (B, R, D), att_len (B,) or None) for images ``idx`` (any order, repeats
        allowed) as numpy arrays in the file's dtype (``feature_dtype``): what the training loader
        hands over. ``out``: (fc, att) arrays to read into (e.g. views of page-locked tensors)."""
        idx = np.asarray(idx, dtype=np.int64)
        fc_out, att_out = out if out is not None else (None, None)
        return (self._read("fc", idx, fc_out), self._read("att", idx, att_out),
                self._read("att_len", idx) if self.has_att_len else None)

    def fc_rows(self, idx) -> np.ndarray:
        """Pooled features fc (B, D) of images ``idx`` in the file's dtype, without reading ``att``."""
        return self._read("fc", np.asarray(idx, dtype=np.int64))

    def features(self, idx, device: torch.device | str = "cpu"):
        """(fc (B, D), att (B, R, D), att_mask (B, R) or None) as float32 tensors for images ``idx``;
        RdppError for features holding NaN or infinity (``check_finite``)."""
        import torch

        fc, att, lens = self.feature_rows(idx)
        fc, att = torch.from_numpy(fc).to(device).float(), torch.from_numpy(att).to(device).float()
        self.check_finite(idx, fc, att)
        return fc, att, att_mask(lens, att.shape[1], device)

    def check_finite(self, idx, fc: torch.Tensor, att: torch.Tensor) -> None:
        """RdppError naming ``features.h5`` and the first of images ``idx`` whose features ``fc``
        (B, D) / ``att`` (B, R, D) hold NaN or infinity (a damaged file, or features imported so)."""
        import torch

        ok = torch.isfinite(fc).flatten(1).all(1) & torch.isfinite(att).flatten(1).all(1)
        if bool(ok.all()):
            return
        row = int(np.asarray(idx, dtype=np.int64)[int((~ok).nonzero()[0])])
        raise RdppError(f"{self.path / 'features.h5'} holds NaN or infinity in the features of image "
                        f"{self.image_ids[row]} (row {row}): the file is damaged or was made from broken features; "
                        f"run `rdpp verify {self.path}`, then restore the file or remake the data artifact")

    def references_ids(self, idx) -> list[np.ndarray]:
        """Encoded references (k_i, L) int32 of each image (what the training reward compares)."""
        labels = self._h5("captions.h5")["labels"]
        out = []
        for i in np.asarray(idx, dtype=np.int64):
            out.append(labels[self.label_start[i]:self.label_end[i]].astype(np.int32))
        return out

    def references_raw(self, idx) -> list[list[str]]:
        """Reference sentences (unclipped, not UNK-mapped) of each image, for scoring."""
        raw = self._h5("captions.h5")["raw"]
        out = []
        for i in np.asarray(idx, dtype=np.int64):
            vals = raw[self.label_start[i]:self.label_end[i]]
            out.append([v.decode() if isinstance(v, bytes) else str(v) for v in vals])
        return out

    def captions_per_image(self, idx, k: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """(B, k, L) int64 labels: k captions per image (all of them when it has exactly k;
        a seeded random choice, with replacement only when it has fewer, otherwise)."""
        labels = self._all_labels()
        out = np.zeros((len(idx), k, self.seq_length), dtype=np.int64)
        for b, i in enumerate(np.asarray(idx, dtype=np.int64)):
            s, e = int(self.label_start[i]), int(self.label_end[i])
            n = e - s
            if n == k:
                out[b] = labels[s:e]
                continue
            rng = rng or np.random.default_rng(0)
            rows = s + (rng.choice(n, k, replace=n < k))
            out[b] = labels[np.sort(rows)] if n >= k else labels[rows]
        return out

    def _all_labels(self) -> np.ndarray:
        """captions.h5 ``labels``, read once (COCO: 616k × 16 int32, 40 MB): a batch then costs no
        HDF5 call per image."""
        if self._labels is None:
            labels = self._h5("captions.h5")["labels"][:]
            with self._lock:
                self._labels = labels
        return self._labels

    @property
    def cider_df_path(self) -> Path:
        return self.artifact.file("cider_df.h5")

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        for h in self._handles.values():
            h.close()
        self._handles = {}

    def __getstate__(self) -> dict:  # a copy in another process opens its own files
        return {**self.__dict__, "_handles": {}, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def att_mask(lens: np.ndarray | None, regions: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """(B, R) float mask of the valid att regions from ``att_len`` (None: every region is valid)."""
    if lens is None:
        return None
    import torch

    lens_t = torch.from_numpy(np.asarray(lens, dtype=np.int64))
    return (torch.arange(regions)[None, :] < lens_t[:, None]).float().to(device)


class RowReader:
    """Rows of one HDF5 dataset of a features file, straight from the file.

    When each row is one uncompressed extent of the file (rdpp's ``FeatureWriter`` layout: chunks
    of one row, no filters; or a contiguous dataset), a row is one ``os.preadv`` of its bytes into
    the output array: no HDF5 selection machinery, no chunk cache, no intermediate copy; rows not
    in the page cache are fetched from disk concurrently (see ``_pread``). (h5py's
    fancy indexing ``ds[[i, j, ...]]`` on one-row chunks is far slower; benchmarks/README.md
    has the figures.) Any other layout (compressed or multi-row chunks, non-native byte order) is
    read through h5py, one row at a time. The extents are checked once against h5py's own read of
    the first and last row; a file whose bytes disagree is read through h5py too.
    """

    def __init__(self, ds: h5py.Dataset, path: Path):
        self.path, self.name = path, ds.name
        self.n, self.row_shape, self.dtype = ds.shape[0], tuple(ds.shape[1:]), ds.dtype
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._fd: int | None = None
        self._fd_pid = 0
        self._lock = threading.Lock()
        self._nowait = hasattr(os, "RWF_NOWAIT")
        self.offsets = row_extents(ds, path)  # checked against h5py's read of the first and last row

    @property
    def direct(self) -> bool:
        """True when rows are read with ``os.preadv`` (the fast path)."""
        return self.offsets is not None

    def read(self, idx: np.ndarray, ds: h5py.Dataset | None, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``idx`` (any order, repeats allowed) as one (len(idx), *row) array of the file's
        dtype (written into ``out`` if given). ``ds``: this reader's dataset, open in this process
        (needed only when ``direct`` is False)."""
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"rows {idx.min()}..{idx.max()} outside 0..{self.n - 1} of {self.path}:{self.name}")
        if out is None:
            out = np.empty((len(idx), *self.row_shape), dtype=self.dtype)
        elif out.shape != (len(idx), *self.row_shape) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out {out.shape} {out.dtype}: expected a C-contiguous {(len(idx), *self.row_shape)} "
                             f"{self.dtype} array")
        if self.offsets is not None:
            return self._pread(idx, out)
        for j in np.argsort(idx, kind="stable"):  # file order
            ds.read_direct(out, np.s_[int(idx[j]):int(idx[j]) + 1], np.s_[int(j):int(j) + 1])
        return out

    def _pread(self, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows in file order, each one ``preadv`` into its place in ``out``. A first pass reads
        what the page cache holds without waiting (``RWF_NOWAIT``); the rows it could not finish
        are then announced together (``POSIX_FADV_WILLNEED``, so the disk fetches them
        concurrently) and read. Warm batches thus cost one call per row, cold ones do not wait
        for one row after another."""
        if out is None:
            out = np.empty((len(idx), *self.row_shape), dtype=self.dtype)
        with self._lock:
            if self._fd is None or self._fd_pid != os.getpid():  # a forked process opens its own descriptor
                self._fd, self._fd_pid = os.open(self.path, os.O_RDONLY), os.getpid()
        fd, rb = self._fd, self.row_bytes
        flat = out.reshape(len(idx), -1).view(np.uint8)
        first: dict[int, int] = {}
        repeats, todo = [], []
        for j in np.argsort(idx, kind="stable"):  # file order: sequential where rows are adjacent
            i = int(idx[j])
            if i in first:
                repeats.append((int(j), first[i]))
                continue
            first[i] = int(j)
            done = self._read_cached(fd, flat[j], int(self.offsets[i])) if self._nowait else 0
            if done < rb:
                todo.append((int(j), i, done))
        if len(todo) > 1 and hasattr(os, "posix_fadvise"):
            for _, i, done in todo:
                os.posix_fadvise(fd, int(self.offsets[i]) + done, rb - done, os.POSIX_FADV_WILLNEED)
        for j, i, done in todo:
            buf = memoryview(flat[j])
            while done < rb:
                got = os.preadv(fd, [buf[done:]], int(self.offsets[i]) + done)
                if got <= 0:
                    raise RdppError(f"{self.path} ends inside row {i} of {self.name}; the file is truncated: "
                                    "rerun the prepro command that wrote it")
                done += got
        for j, k in repeats:  # a repeated row: a copy of the one read
            flat[j] = flat[k]
        return out

    def _read_cached(self, fd: int, dest: np.ndarray, offset: int) -> int:
        """Bytes of one row read from the page cache without waiting for the disk (0 if none)."""
        try:
            return max(0, os.preadv(fd, [memoryview(dest)], offset, os.RWF_NOWAIT))
        except BlockingIOError:
            return 0
        except OSError:  # RWF_NOWAIT not supported here: always the blocking path
            self._nowait = False
            return 0

    def close(self) -> None:
        if self._fd is not None and self._fd_pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
