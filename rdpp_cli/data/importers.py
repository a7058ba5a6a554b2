"""``--features-from``: existing per-image region features instead of running a CNN.

Accepted sources (every image of the caption file must be present; extra ids are ignored):

- an HDF5 file with ``att`` (N, R, D) (and optionally ``fc`` (N, D), ``att_len`` (N,)) plus
  ``image_ids`` (N,) — e.g. another rdpp ``features.h5``;
- an HDF5 file with one dataset per image id, ``"<id>"`` -> (R_i, D), or one group per id holding
  ``feat``/``x``/``att`` (and optionally ``fc``);
- a folder of ``<id>.npy`` (R_i, D) or ``<id>.npz`` with ``feat``/``x``/``att``/``features``/``arr_0``
  (bottom-up attention's layout) and optionally ``fc``; or a folder with ``*_att`` and ``*_fc``
  subfolders (``cocobu_att/<id>.npz`` + ``cocobu_fc/<id>.npy``).

``fc`` is the mean over regions when the source has none. A NaN or infinity in an image's ``att``
regions or its ``fc`` stops the import with one line naming the image. Variable region counts are zero-padded
to the largest count R and recorded in ``att_len``. Rows go through the same ``FeatureWriter``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from rdpp_cli.errors import RdppError

ATT_KEYS = ("feat", "x", "att", "features", "arr_0")


class FeatureSource:
    """Scanned features of a list of image ids: shapes known, arrays read on demand."""

    def __init__(self, path: Path | str, image_ids: Sequence[int]):
        self.path = Path(path)
        self.image_ids = [int(i) for i in image_ids]
        if not self.path.exists():
            raise RdppError(f"--features-from {self.path} does not exist; pass an HDF5 file or a folder of "
                            "<image id>.npy/.npz files")
        if self.path.is_dir():
            self._scan_folder()
        else:
            self._scan_h5()
        self.regions = int(max(self.counts)) if self.counts else 0
        self.varying = len(set(self.counts)) > 1

    # -- scanning (shapes only) -------------------------------------------------------------------
    def _scan_h5(self) -> None:
        try:
            f = h5py.File(self.path, "r")
        except OSError:
            raise RdppError(f"--features-from {self.path} is neither a folder nor an HDF5 file") from None
        with f:
            if "att" in f and "image_ids" in f:
                self.kind = "h5-arrays"
                ids = f["image_ids"][:].astype(np.int64)
                row = {int(v): r for r, v in enumerate(ids)}
                missing = [i for i in self.image_ids if i not in row]
                self._missing(missing)
                self.rows = [row[i] for i in self.image_ids]
                n, r, d = f["att"].shape
                lens = f["att_len"][:] if "att_len" in f else np.full(n, r)
                self.counts = [int(lens[i]) for i in self.rows]
                self.dim, self.has_fc = int(d), "fc" in f
            else:
                self.kind = "h5-per-id"
                missing = [i for i in self.image_ids if str(i) not in f]
                self._missing(missing)
                self.counts, dims = [], set()
                for i in self.image_ids:
                    obj = f[str(i)]
                    ds = obj if isinstance(obj, h5py.Dataset) else _first(obj, ATT_KEYS, f"{self.path}:{i}")
                    shape = _regions_shape(ds.shape, f"{self.path}:{i}")
                    self.counts.append(shape[0])
                    dims.add(shape[1])
                self.dim = self._one_dim(dims)

    def _scan_folder(self) -> None:
        subs = {p.name: p for p in self.path.iterdir() if p.is_dir()}
        att_dir = next((p for n, p in sorted(subs.items()) if n.endswith("_att")), None)
        fc_dir = next((p for n, p in sorted(subs.items()) if n.endswith("_fc")), None)
        self.kind = "folder"
        self.att_dir = att_dir or self.path
        self.fc_dir = fc_dir
        self.files, self.counts, dims = [], [], set()
        missing = []
        for i in self.image_ids:
            p = next((q for q in (self.att_dir / f"{i}.npz", self.att_dir / f"{i}.npy") if q.is_file()), None)
            if p is None:
                missing.append(i)
                continue
            self.files.append(p)
        self._missing(missing)
        for p in self.files:
            shape = _regions_shape(_npy_shape(p), str(p))
            self.counts.append(shape[0])
            dims.add(shape[1])
        self.dim = self._one_dim(dims)

    def _missing(self, missing: list[int]) -> None:
        if missing:
            raise RdppError(f"--features-from {self.path} has no features for {len(missing)} image(s) of the caption "
                            f"file (e.g. id {missing[0]}); import from a source that covers every image")

    def _one_dim(self, dims: set[int]) -> int:
        if len(dims) != 1:
            raise RdppError(f"--features-from {self.path} mixes feature sizes {sorted(dims)}; every image needs the same D")
        return dims.pop()

    # -- reading ------------------------------------------------------------------------------------
    def batches(self, start: int, size: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(fc (B, D), att (B, R, D) zero-padded, att_len (B,)) for images ``start:`` in blocks of ``size``."""
        h5 = h5py.File(self.path, "r") if self.kind != "folder" else None
        try:
            for s in range(start, len(self.image_ids), size):
                rows = range(s, min(s + size, len(self.image_ids)))
                att = np.zeros((len(rows), self.regions, self.dim), dtype=np.float32)
                fc = np.zeros((len(rows), self.dim), dtype=np.float32)
                lens = np.zeros(len(rows), dtype=np.int32)
                for b, k in enumerate(rows):
                    a, c = self._read(h5, k)
                    self._check_finite(k, a, c)
                    att[b, :len(a)] = a
                    fc[b] = c if c is not None else (a.mean(axis=0) if len(a) else 0.0)
                    lens[b] = len(a)
                yield fc, att, lens
        finally:
            if h5 is not None:
                h5.close()

    def _check_finite(self, k: int, att: np.ndarray, fc: np.ndarray | None) -> None:
        """RdppError naming the image and the array when its ``att`` regions or its ``fc`` hold NaN or
        infinity: a model would train on them (or its loss turn NaN) and consensus re-ranking fail."""
        for name, arr in (("att", att), ("fc", fc)):
            if arr is not None and not np.isfinite(arr).all():
                raise RdppError(f"--features-from {self.path}: the {name} features of image {self.image_ids[k]} hold "
                                "NaN or infinity; fix or drop them at the source, then rerun the same command (the "
                                "images imported so far are kept)")

    def _read(self, h5, k: int) -> tuple[np.ndarray, np.ndarray | None]:
        i = self.image_ids[k]
        if self.kind == "h5-arrays":
            r = self.rows[k]
            a = h5["att"][r][: self.counts[k]]
            return a.reshape(len(a), -1), (h5["fc"][r] if self.has_fc else None)
        if self.kind == "h5-per-id":
            obj = h5[str(i)]
            if isinstance(obj, h5py.Dataset):
                a = obj[()]
                return a.reshape(-1, a.shape[-1]), None
            a = _first(obj, ATT_KEYS, "")[()]
            return a.reshape(-1, a.shape[-1]), (obj["fc"][()].reshape(-1) if "fc" in obj else None)
        p = self.files[k]
        fc = None
        if p.suffix == ".npz":
            with np.load(p) as z:
                a = z[next(key for key in ATT_KEYS + tuple(z.files) if key in z.files)]
                fc = z["fc"].reshape(-1) if "fc" in z.files else None
        else:
            a = np.load(p)
        if fc is None and self.fc_dir is not None:
            fp = self.fc_dir / f"{i}.npy"
            if fp.is_file():
                fc = np.load(fp).reshape(-1)
        if a.ndim == 3:  # (H, W, D) grid
            a = a.reshape(-1, a.shape[-1])
        elif a.ndim == 1:
            a = a[None, :]
        if fc is not None and fc.shape[0] != self.dim:
            raise RdppError(f"{p}: fc has {fc.shape[0]} values but att has D={self.dim}; fc and att must share D")
        return a, fc


def _first(group, keys: Sequence[str], where: str):
    for k in keys:
        if k in group:
            return group[k]
    raise RdppError(f"{where} holds none of {', '.join(keys)}; expected a (regions, D) feature array")


def _regions_shape(shape: tuple, where: str) -> tuple[int, int]:
    if len(shape) == 2:
        return int(shape[0]), int(shape[1])
    if len(shape) == 3:  # a (G, G, D) grid
        return int(shape[0] * shape[1]), int(shape[2])
    if len(shape) == 1:  # a single vector
        return 1, int(shape[0])
    raise RdppError(f"{where} has shape {shape}; expected (regions, D)")


def _npy_shape(path: Path) -> tuple:
    """Shape of the region array, from headers only."""
    try:
        if path.suffix == ".npy":
            with open(path, "rb") as fh:
                return _header_shape(fh)
        with zipfile.ZipFile(path) as z:
            names = [n.removesuffix(".npy") for n in z.namelist()]
            key = next((k for k in ATT_KEYS + tuple(names) if k in names), None)
            if key is None:
                raise ValueError("empty archive")
            with z.open(key + ".npy") as fh:
                return _header_shape(fh)
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise RdppError(f"{path} is not a readable .npy/.npz feature file ({e}); replace it") from None


def _header_shape(fh) -> tuple:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _, _ = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, _, _ = np.lib.format.read_array_header_2_0(fh)
    return shape
