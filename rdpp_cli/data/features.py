"""``features.h5``: written block by block as features are computed, read back, resumable.

``FeatureWriter`` owns the file. Rows are written in blocks of ``block`` images (the batch size).
A block counts as written only once it is on the disk: its rows are flushed, read back with
``os.pread`` (past HDF5's caches: HDF5 can lose a failed write without raising, as on a full disk),
compared with what was written, and only then its digest (``_digests``, over the bytes read back)
and the number of finished rows (attr ``_done``) are recorded and flushed. A run that dies (Ctrl-C,
a crash, a full disk, a lost machine) resumes when the same command runs again: the blocks an
earlier run recorded are read back from the disk and checked against their digests first, and the
first one that differs (never written, changed since) is extracted again, with every block after it.
The file's content hash (``artifacts.content_hash``) is finished from those digests, each of bytes
read from the disk; ``finish`` fsyncs the file first, so a write the disk failed later is said there.

``extract_features`` runs a backbone over image files through a DataLoader (``workers`` processes
decode images; memory does not grow with the number of images).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from rdpp_cli.artifacts import content_hash
from rdpp_cli.artifacts.files import write_failure
from rdpp_cli.console import info, note, progress
from rdpp_cli.data.backbones import Backbone
from rdpp_cli.data.options import FEATURE_DTYPES
from rdpp_cli.device import resolve_device
from rdpp_cli.errors import RdppError

DTYPES = {name: np.dtype(name).type for name in FEATURE_DTYPES}  # --dtype


class FeatureWriter:
    """Write ``fc`` (N, D), ``att`` (N, R, D) and optional ``att_len`` (N,) row-block by row-block.

    ``FeatureWriter(path, image_ids, fc_dim=D, regions=R, dtype="float16", block=B, attrs={...})``
    opens an unfinished file with the same layout and resumes at ``writer.done`` (the rows of the
    blocks found on disk as recorded); anything else at ``path`` is replaced. ``write(fc, att,
    att_len)`` appends the next block (exactly ``block`` rows except the last). ``finish()`` returns
    the manifest's precomputed hash entry. A failed write raises an ``OSError`` naming the file, the
    free space on its disk and about how much more the file needs.
    """

    def __init__(self, path: Path, image_ids: np.ndarray, *, fc_dim: int, regions: int, dtype: str = "float16",
                 block: int, attrs: dict | None = None, with_att_len: bool = False):
        if dtype not in DTYPES:
            raise RdppError(f"--dtype {dtype} is not supported; use float16 or float32")
        self.path = Path(path)
        self.image_ids = np.asarray(image_ids, dtype=np.int64)
        self.n, self.fc_dim, self.regions, self.block = len(self.image_ids), int(fc_dim), int(regions), int(block)
        self.dtype = np.dtype(DTYPES[dtype])
        self.with_att_len = with_att_len
        self.attrs = {"dtype": dtype, **(attrs or {}), "_block": self.block}
        self.names = ["fc", "att"] + (["att_len"] if with_att_len else []) + ["image_ids"]
        self.failed, self.done = False, 0
        self.f = self._open()
        # the datasets stay open: HDF5 then never writes them out when a temporary handle is
        # dropped, where a failed write is printed and ignored instead of raised
        self.ds = {name: self.f[name] for name in [*self.names, "_digests"]}
        self._fd = os.open(self.path, os.O_RDONLY)  # reads back what was written, past HDF5's caches
        self.done = self._rows_on_disk()
        if 0 < self.done < self.n:
            info(f"resuming feature extraction at image {self.done:,} of {self.n:,}")

    # -- opening / resuming ------------------------------------------------------------------
    def _layout_matches(self, f: h5py.File) -> bool:
        try:
            same = (f["fc"].shape == (self.n, self.fc_dim) and f["att"].shape == (self.n, self.regions, self.fc_dim)
                    and f["fc"].dtype == self.dtype and ("att_len" in f) == self.with_att_len
                    and np.array_equal(f["image_ids"][:], self.image_ids)
                    and all(_attr_eq(f.attrs.get(k), v) for k, v in self.attrs.items())
                    and f["_digests"].shape == (self.nblocks, 32))
            done = int(f.attrs.get("_done", -1))
            return same and 0 <= done <= self.n and (done % self.block == 0 or done == self.n)
        except (KeyError, OSError, ValueError, RuntimeError):  # a damaged file: start over
            return False

    @property
    def nblocks(self) -> int:
        return -(-self.n // self.block)

    def _open(self) -> h5py.File:
        # rdcc_nbytes=0: no chunk cache, so a row block goes to the file inside the write that raises
        if self.path.exists():
            try:
                f = h5py.File(self.path, "r+", rdcc_nbytes=0)
            except OSError:
                f = None
            matches = f is not None and self._layout_matches(f)
            if matches and int(f.attrs["_done"]) > 0:
                return f
            if f is not None:
                f.close()
            if not matches:  # (a file of no rows holds nothing to keep: laid out again, quietly)
                info(f"{self.path} is from another run or damaged: extracting from the start")
            self.path.unlink()
        f = None
        try:
            f = h5py.File(self.path, "w", rdcc_nbytes=0)
            r, d = self.regions, self.fc_dim
            f.create_dataset("fc", (self.n, d), dtype=self.dtype, chunks=(1, d) if self.n else None)
            f.create_dataset("att", (self.n, r, d), dtype=self.dtype, chunks=(1, r, d) if self.n else None)
            if self.with_att_len:
                f.create_dataset("att_len", (self.n,), dtype=np.int32)
            f.create_dataset("image_ids", data=self.image_ids)
            f.create_dataset("_digests", (self.nblocks, 32), dtype=np.uint8)
            for k, v in self.attrs.items():
                f.attrs[k] = v
            f.attrs["_done"] = 0
            f.flush()
        except (OSError, RuntimeError) as e:  # a full disk already while laying the file out
            if f is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    f.close()
            with contextlib.suppress(OSError):
                self.path.unlink()  # a layout cut short holds no row: the rerun lays it out again
            raise self._failure(e) from e
        return f

    def _rows_on_disk(self) -> int:
        """The rows an earlier run recorded (``_done``) whose blocks are on the disk as recorded: each
        block read back now and its digest compared with the one recorded. The first block that
        differs (never on the disk: zeros after a full disk; changed since) is where writing resumes."""
        done = int(self.f.attrs["_done"])
        if not done:
            return 0
        plans = [(content_hash.chunk_offsets(self.ds[d]), content_hash.row_bytes(self.ds[d])) for d in self.names]
        if any(offsets is None for offsets, _ in plans):
            note(f"{self.path}: its rows are not stored as rdpp writes them; extracting from the start")
            return 0
        with progress("rows", transient=True) as bar:
            task = bar.add_task(f"check {self.path.name} (written before)", total=done, info="")
            found = content_hash.block_digests(self._fd, plans, self.block, done,
                                               advance=lambda k: bar.advance(task, k))
        for b, (digest, recorded) in enumerate(zip(found, self.ds["_digests"][:len(found)])):
            if digest != bytes(recorded):
                s = b * self.block
                note(f"{self.path}: rows {s:,} to {min(s + self.block, done) - 1:,} are not on the disk as written "
                     f"(a write that failed, or changed since); extracting again from image {s:,}")
                return s
        return done

    # -- writing -------------------------------------------------------------------------------
    def write(self, fc, att, att_len=None) -> None:
        """Append the next block: write and flush its rows, read them back from the disk, and only then
        record it as written (its digest and the row count, flushed too)."""
        fc = np.asarray(fc, dtype=self.dtype)
        att = np.asarray(att, dtype=self.dtype)
        k = fc.shape[0]
        s = self.done
        if k != min(self.block, self.n - s) or att.shape != (k, self.regions, self.fc_dim):
            raise ValueError(f"block of {k} rows at {s}: expected {min(self.block, self.n - s)} rows of "
                             f"att ({self.regions}, {self.fc_dim})")
        arrays = [fc, att] + ([np.asarray(att_len, dtype=np.int32)] if self.with_att_len else [])
        try:
            for name, a in zip(self.names, arrays):
                self.ds[name][s:s + k] = a
            self.f.flush()
            digest = self._read_back(s, k, [*arrays, self.image_ids[s:s + k]])
            self.ds["_digests"][s // self.block] = np.frombuffer(digest, dtype=np.uint8)
            self.f.attrs["_done"] = s + k
            self.f.flush()
        except (OSError, RuntimeError) as e:  # h5py raises a failed flush as RuntimeError
            raise self._failure(e) from e
        self.done = s + k

    def _read_back(self, s: int, k: int, arrays: list[np.ndarray]) -> bytes:
        """The block's digest over rows ``s:s+k`` as read from the file now; OSError when they are
        not the ``arrays`` just written."""
        h = hashlib.sha256()
        for name, a in zip(self.names, arrays):
            ds = self.ds[name]
            offsets = content_hash.row_offsets(ds, s, s + k)
            on_disk = None if offsets is None else content_hash.read_rows(self._fd, offsets,
                                                                           content_hash.row_bytes(ds), 0, k)
            if on_disk is None or not np.array_equal(on_disk, np.ascontiguousarray(a).reshape(-1).view(np.uint8)):
                raise OSError(None, f"rows {s:,} to {s + k - 1:,} of {name} are not on the disk after writing them")
            h.update(on_disk)
        return h.digest()

    def _failure(self, e: OSError | RuntimeError) -> OSError | RuntimeError:
        """``e`` naming this file, with about how many bytes its unwritten rows still need (``e`` as it
        is when it is no failed write: a bug)."""
        self.failed = True
        row = (self.fc_dim * (1 + self.regions)) * self.dtype.itemsize + 4 * self.with_att_len
        return write_failure(e, self.path, needed=(self.n - self.done) * row) or e

    def finish(self) -> dict:
        """fsync and close the file (a write the disk failed after it was read back is said here);
        the precomputed hash entry for ``write_manifest``, over the digests of blocks read from the disk."""
        if self.done != self.n:
            raise RuntimeError(f"features.h5 has {self.done} of {self.n} rows")
        digests = [bytes(d) for d in self.ds["_digests"][:]]
        try:
            self._sync()
        except (OSError, RuntimeError) as e:
            raise self._failure(e) from e
        self.close()
        return {"sha256": content_hash.combine(digests), "hash_of": content_hash.spec(self.names, self.block)}

    def _sync(self) -> None:
        """Flush the file and wait until the disk has it."""
        self.f.flush()
        os.fsync(self._fd)

    def close(self) -> None:
        """Close the file; after a failed write, quietly (the disk may still be full: what is not on
        it is found and written again on the next run)."""
        if not self.f:
            return
        self.ds = {}
        try:
            self.f.close()
        except (OSError, RuntimeError):
            if not self.failed:
                raise
        finally:
            self.f = None
            os.close(self._fd)


def _attr_eq(stored, wanted) -> bool:
    if isinstance(stored, bytes):
        stored = stored.decode()
    if isinstance(stored, np.generic):
        stored = stored.item()
    return stored == wanted


def default_workers(device: str = "cuda") -> int:
    """Image-decoding processes when ``--workers`` is not given, for extraction on ``device``'s type.

    GPU: one per core left over after the main process, at most 8 (decoding JPEGs is the bottleneck
    there). CPU: a quarter of the cores, rounded down (0 on 2 cores). There the CNN's forward runs on
    torch's threads on every core and a decoding process takes cores from it (benchmarks/README.md,
    "Feature extraction and writing", has the figures).
    Decoding a COCO photo costs about a quarter of the CPU time of its forward pass, hence a quarter
    of the cores on larger CPUs (derived from those per-image costs, not measured on such a machine).
    Never more than the cores, which makes torch warn on every run."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    if str(device).startswith("cpu"):
        return min(8, cores // 4)
    return max(0, min(8, cores - 1))


def read_image(path: Path, size: int) -> np.ndarray:
    """The image at ``path`` as (3, size, size) float32 RGB in [0, 1] (docs/data.md, "Images"):

    - turned upright by its EXIF orientation (phones store pixels sideways and say so in EXIF);
    - greyscale, palette, CMYK and YCbCr converted to RGB, 16-bit greyscale scaled to 8 bits,
      transparency composited onto white;
    - the whole image resized to size×size (bilinear, antialiased when shrinking), aspect ratio not
      kept and nothing cropped: captions speak of the whole photo. Any size and aspect ratio works.

    Raises whatever PIL raises for a file it cannot decode (truncated, corrupt).
    """
    im = open_upright_rgb(path)
    if im.size != (size, size):
        im = im.resize((size, size), _pil().BILINEAR)
    return np.asarray(im, dtype=np.float32).transpose(2, 0, 1) / 255.0


def open_upright_rgb(path: Path):
    """The image at ``path`` as an RGB PIL image turned upright by its EXIF orientation, decoded in
    full (``read_image``'s first two steps; what a Hugging Face image processor is given)."""
    from PIL import ImageOps

    with _pil().open(path) as im:
        if im.getexif().get(0x0112, 1) != 1:  # EXIF orientation: not stored upright
            im = ImageOps.exif_transpose(im)
        im = to_rgb(im)
        im.load()
        return im


def to_rgb(im):
    """``im`` as an RGB PIL image (the conversions of ``read_image``)."""
    from PIL import Image

    if im.mode == "RGB":
        return im
    if im.mode.startswith("I;16") or im.mode in ("I", "F"):  # 16-bit or float greyscale
        scale = 1 / 257 if im.mode.startswith("I;16") or np.asarray(im).max() > 255 else 1.0
        grey = np.clip(np.asarray(im, dtype=np.float64) * scale + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im.convert("RGB")  # L, 1, P, CMYK (Adobe-inverted CMYK included), YCbCr, LAB, HSV


class ImageFiles(Dataset):
    """Images read by ``read_image`` at S×S, normalised, as (3, S, S) float tensors (or, given a Hugging
    Face image ``processor``, read upright and RGB and prepared by it); a file that cannot be decoded
    comes back flagged (never raised inside a worker) so the main process can name it."""

    def __init__(self, paths: Sequence[Path], image_size: int, mean=None, std=None, processor=None):
        self.paths, self.size, self.processor = list(paths), image_size, processor
        self.mean = None if mean is None else torch.tensor(mean).view(3, 1, 1)
        self.std = None if std is None else torch.tensor(std).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            if self.processor is not None:
                pixels = self.processor(images=open_upright_rgb(self.paths[i]), return_tensors="pt").pixel_values
                return pixels[0].float(), i, ""
            x = torch.from_numpy(read_image(self.paths[i], self.size))
        except Exception as e:  # PIL raises many kinds for broken files
            return torch.zeros(3, self.size, self.size), i, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x, i, ""


# What a complete file of these formats ends with; a file that does not is decoded in full up front.
_END_MARKERS = {"JPEG": (b"\xff\xd9",), "PNG": (b"IEND\xaeB`\x82",), "GIF": (b";",)}


@functools.cache
def _pil():
    """PIL's Image module, with its DecompressionBombWarning silenced in this process: rdpp says it
    in its own words (``image_problem``), once per file, instead of a raw Python warning."""
    import warnings

    from PIL import Image

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image


def image_problem(p: Path, what: str = "remove it from the caption file or replace it") -> RdppError | None:
    """Why ``p`` cannot be used as an image (None when it can). A JPEG/PNG/GIF is read by its header
    and its last bytes: one that does not end with its end marker (a truncated download, a copy
    that stopped) is decoded in full to tell a truncated file from one with trailing bytes. Any other
    format (BMP, TIFF, WebP, PPM, ...) has no end marker to look at and is decoded in full.
    ``what``: what the user should do about it (the end of the message). An image larger than
    PIL's decompression-bomb limit (but under twice it, which PIL refuses) is used, with a note."""
    from PIL import UnidentifiedImageError

    Image = _pil()
    try:
        with Image.open(p) as im:
            w, h = im.size  # header only
            markers = _END_MARKERS.get(im.format or "")
            if not markers or not _ends_with(p, markers):
                try:
                    im.load()
                except (OSError, ValueError, SyntaxError) as e:
                    return RdppError(f"{p} cannot be decoded, it is truncated or damaged ({_why(e)}); {what}")
    except Image.DecompressionBombError as e:
        return RdppError(f"{p} is too large to decode safely ({_why(e)}); {what}")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        return RdppError(f"{p} is not an image ({type(e).__name__}); {what}")
    if Image.MAX_IMAGE_PIXELS and w * h > Image.MAX_IMAGE_PIXELS:
        limit = Image.MAX_IMAGE_PIXELS / 1e6
        note(f"{p} is {w}×{h} ({w * h / 1e6:.3g} megapixels), over the {limit:.3g} megapixels PIL trusts not to be "
             "a decompression bomb; reading it anyway (it takes memory and time)")
    return None


def _why(e: Exception) -> str:
    return (str(e).splitlines()[0] if str(e) else type(e).__name__)[:120]


def _ends_with(p: Path, markers: tuple[bytes, ...], tail: int = 64) -> bool:
    with open(p, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - tail))
        end = f.read().rstrip(b"\x00\r\n\t ")  # padding some writers leave after the marker
    return any(end.endswith(m) for m in markers)


def check_images(paths: Sequence[Path], images_root: Path | None = None, workers: int = 4,
                 what: str = "remove it from the caption file or replace it") -> None:
    """Every image file exists and can be read (``image_problem``; ``what``: what the user should do
    about a bad one): fails with one line naming the first bad file, before anything is written."""
    from concurrent.futures import ThreadPoolExecutor

    for p in paths:
        if not p.is_file():
            raise RdppError(f"image file {p} is missing (from the caption file, under --images-root {images_root}); "
                            "pass the folder that holds the images")

    pool = ThreadPoolExecutor(max(1, workers))
    try:
        with progress("images") as bar:
            task = bar.add_task("check images", total=len(paths), info="")
            for problem in pool.map(functools.partial(image_problem, what=what), paths):
                if problem:
                    raise problem
                bar.advance(task)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on the first bad file, skip the rest


def extract_features(writer: FeatureWriter, paths: Sequence[Path], backbone: Backbone, *,
                     device: str = "auto", workers: int = 0) -> float | None:
    """Run ``backbone`` over ``paths[writer.done:]`` in batches of ``writer.block`` and write each
    batch as it comes (the first unfinished block onward, so a rerun resumes). Returns the images/s
    of this run (None when there was nothing left to do)."""
    start = writer.done
    n = 0
    t0 = time.perf_counter()
    for fc, att in iter_features(paths[start:], backbone, batch_size=writer.block, device=device, workers=workers,
                                 total=len(paths), completed=start, resume_hint=True):
        writer.write(fc, att)
        n += len(fc)
    return n / (time.perf_counter() - t0) if n else None


def _forward(module, x: torch.Tensor, chunk: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``module(x)``, or with ``chunk``: ``chunk`` images at a time in channels-last layout (the CPU path)."""
    if not chunk:
        return module(x)
    outs = [module(x[i:i + chunk].contiguous(memory_format=torch.channels_last)) for i in range(0, len(x), chunk)]
    return torch.cat([fc for fc, _ in outs]), torch.cat([att for _, att in outs])


def iter_features(paths: Sequence[Path], backbone: Backbone, *, batch_size: int, device: str = "auto",
                  workers: int = 0, total: int | None = None, completed: int = 0, resume_hint: bool = False):
    """``(fc (B, D), att (B, G*G, D))`` float32 numpy arrays for ``paths`` in batches of ``batch_size``,
    read by ``read_image`` in ``workers`` processes; a file that cannot be decoded stops it with
    one line naming the file. The one extraction loop of ``prepro coco`` and ``rdpp caption``."""
    dev = resolve_device(device)
    module = backbone.module.to(dev).eval()
    chunk = backbone.cpu_chunk if dev.type == "cpu" else None
    if chunk:
        module = module.to(memory_format=torch.channels_last)
    data = ImageFiles(paths, backbone.image_size, backbone.mean, backbone.std, backbone.processor)
    loader = DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=dev.type == "cuda", persistent_workers=False)
    then = ", then rerun to resume" if resume_hint else ""
    threads = torch.get_num_threads()
    if backbone.threads:
        torch.set_num_threads(backbone.threads)
    try:
        with progress("images") as bar, torch.inference_mode():
            task = bar.add_task(f"extract {backbone.name}", total=total if total is not None else len(paths),
                                completed=completed, info="")
            for x, idx, errors in loader:
                for i, err in zip(idx.tolist(), errors):
                    if err:
                        raise RdppError(f"image file {paths[i]} could not be decoded ({err}); "
                                        f"replace it or remove it from the caption file{then}")
                fc, att = _forward(module, x.to(dev, non_blocking=True), chunk)
                yield fc.float().cpu().numpy(), att.float().cpu().numpy()
                bar.advance(task, len(idx))
    finally:
        torch.set_num_threads(threads)
