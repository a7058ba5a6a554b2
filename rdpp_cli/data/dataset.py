"""Read access to a data artifact: vocabulary, splits, features and references.

Reads only the rows asked for (COCO's att features are ~100 GB): every accessor takes image
indices (rows of captions.h5 / features.h5) and returns just those images. HDF5 handles are opened
lazily per process, so a ``DataArtifact`` can be handed to DataLoader workers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import torch

from rdpp_cli.artifacts import Artifact, read_artifact
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
            artifact.file(name)  # cheap size check, clear error when missing
        self.words: list[str] = json.loads((self.path / "vocab.json").read_text())["words"]
        with h5py.File(self.path / "captions.h5", "r") as f:
            self.image_ids = f["image_ids"][:].astype(np.int64)
            self.split = np.array([s.decode() if isinstance(s, bytes) else str(s) for s in f["split"][:]])
            self.label_start = f["label_start"][:].astype(np.int64)
            self.label_end = f["label_end"][:].astype(np.int64)
            self.seq_length = int(f["labels"].shape[1])
        with h5py.File(self.path / "features.h5", "r") as f:
            self.fc_dim = int(f["fc"].shape[1])
            self.att_regions, self.att_dim = int(f["att"].shape[1]), int(f["att"].shape[2])
            self.has_att_len = "att_len" in f
            feature_ids = f["image_ids"][:].astype(np.int64) if "image_ids" in f else None
        if feature_ids is None or not np.array_equal(feature_ids, self.image_ids):
            raise RdppError(f"{self.path}: features.h5 and captions.h5 do not hold the same images in the same order "
                            f"({_first_difference(feature_ids, self.image_ids)}); the artifact is inconsistent: remake "
                            "it with `rdpp prepro toy` or `rdpp prepro coco`")
        self._handles: dict[str, h5py.File] = {}
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
        out = []
        for i in (ids.tolist() if hasattr(ids, "tolist") else ids):
            if i == 0:
                break
            out.append(self.words[i - 1])
        return " ".join(out)

    # -- rows ---------------------------------------------------------------------------------
    def split_indices(self, split: str) -> np.ndarray:
        if split not in SPLITS:
            raise RdppError(f"unknown split '{split}'; use one of {', '.join(SPLITS)}")
        idx = np.flatnonzero(self.split == split)
        if len(idx) == 0:
            raise RdppError(f"data artifact {self.path} has no images in split '{split}'")
        return idx

    def _h5(self, name: str) -> h5py.File:
        if self._pid != os.getpid():  # forked into a worker: never share HDF5 handles
            self._handles, self._pid = {}, os.getpid()
        if name not in self._handles:
            self._handles[name] = h5py.File(self.path / name, "r")
        return self._handles[name]

    @staticmethod
    def _read_rows(ds, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (any order, repeats allowed) of an HDF5 dataset, reading each row once."""
        idx = np.asarray(idx, dtype=np.int64)
        uniq, inverse = np.unique(idx, return_inverse=True)
        if len(uniq) and uniq[-1] - uniq[0] + 1 == len(uniq):  # contiguous: one slice read
            block = ds[int(uniq[0]):int(uniq[-1]) + 1]
        else:
            block = ds[uniq]
        return block[inverse]

    def features(self, idx, device: torch.device | str = "cpu"):
        """(fc (B, D), att (B, R, D), att_mask (B, R) or None) as float32 tensors for images ``idx``."""
        f = self._h5("features.h5")
        fc = torch.from_numpy(self._read_rows(f["fc"], idx).astype(np.float32))
        att = torch.from_numpy(self._read_rows(f["att"], idx).astype(np.float32))
        mask = None
        if self.has_att_len:
            lens = torch.from_numpy(self._read_rows(f["att_len"], idx).astype(np.int64))
            mask = (torch.arange(att.shape[1])[None, :] < lens[:, None]).float().to(device)
        return fc.to(device), att.to(device), mask

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
        labels = self._h5("captions.h5")["labels"]
        out = np.zeros((len(idx), k, self.seq_length), dtype=np.int64)
        for b, i in enumerate(np.asarray(idx, dtype=np.int64)):
            s, e = int(self.label_start[i]), int(self.label_end[i])
            n = e - s
            if n == k:
                rows = np.arange(s, e)
            else:
                rng = rng or np.random.default_rng(0)
                rows = s + (rng.choice(n, k, replace=n < k))
            block = labels[s:e]  # one contiguous read; h5py cannot index unsorted or repeated rows
            out[b] = block[np.sort(rows) - s] if n >= k else block[rows - s]
        return out

    @property
    def cider_df_path(self) -> Path:
        return self.artifact.file("cider_df.h5")

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        self._handles = {}
