"""Caption files as people have them -> the Karpathy-form dataset ``rdpp prepro coco`` reads.

``rdpp prepro coco --captions FILE [--captions FILE ...]`` recognises each file by its content
(``detect``): a Karpathy split JSON, a COCO caption-annotation file, a Flickr8k/Flickr30k token
file, or a CSV / JSON Lines file of ``image,caption[,split]``. Each format's reader turns its file
into ``Photo`` entries (the image file, its captions as written, split, id, and where in the file
it was named), and ``to_dataset`` turns those into the ``{"images": [...]}`` of a Karpathy split
file, which ``karpathy.records_from_dataset`` reads exactly as it reads ``--karpathy-json``: the
vocabulary, captions, features and document frequencies are then the same code. The rules (how
each format is recognised, where images are looked for, splits and ids) are in docs/data.md,
"Caption files".
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rdpp_cli.artifacts import sha256_file
from rdpp_cli.console import note
from rdpp_cli.data.karpathy import KARPATHY_SPLITS, tokenize
from rdpp_cli.errors import RdppError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
# column names (CSV header) and keys (JSON Lines) read as the image, the caption, the split, the id
IMAGE_KEYS = ("image", "file", "filename", "file_name", "image_file", "path")
CAPTION_KEYS = ("caption", "sentence", "text", "raw")
SPLIT_KEYS = ("split",)
ID_KEYS = ("image_id",)
FLICKR_LINE = re.compile(r"^(?P<image>[^\t#]*)#(?P<k>\d+)\t(?P<caption>.*)$")
# Flickr8k's official split lists, found beside its token file (Flickr_8k.trainImages.txt, ...)
FLICKR_LISTS = {"trainimages.txt": "train", "devimages.txt": "val", "testimages.txt": "test"}
# folders the Flickr archives unpack their photos into, looked for beside the token file
FLICKR_FOLDERS = ("Flicker8k_Dataset", "Flickr8k_Dataset", "flickr30k-images", "flickr30k_images", "Images", "images")
LEFT_OUT = "-"  # the split of a Flickr8k image that none of the split lists names
FORMAT_HELP = ("expected a Karpathy split JSON, a COCO caption file (captions_*.json), a Flickr token file "
               "(<image>#<k><TAB><caption>) or CSV/JSON Lines with image and caption columns (docs/data.md)")


@dataclass
class Photo:
    """One image as a caption file names it, with its captions as written."""

    name: str  # the image file as written: relative to the file's image folder, or absolute
    where: str  # "FILE, line N" (or "FILE, images[k]") where it is first named
    captions: list[str] = field(default_factory=list)
    split: str | None = None  # None: no file says (the hash rule decides)
    image_id: int | None = None  # None: from the file names (``ids_from_names``)
    coco: bool = False  # from a COCO file: its id is COCO's, and the Karpathy split file knows it
    relpath: str = ""  # relative to the images root, set once the root is known


@dataclass
class CaptionSource:
    """The caption files of a run and the Karpathy-form dataset made of them."""

    files: list[tuple[Path, str]]  # every caption file and its format
    dataset: dict  # Karpathy form: the lone Karpathy JSON's own content, or derived from the files
    derived: bool  # True when converted from other formats (kept in the artifact as dataset.json)
    images_root: Path | None = None  # where relpaths start (None: found as for --karpathy-json)
    side_files: list[Path] = field(default_factory=list)  # split lists read beside Flickr token files

    def describe(self) -> list[dict]:
        """Each source file (caption files and split lists) with its format and sha256: the manifest's
        record of where the captions came from."""
        rows = [(p, fmt) for p, fmt in self.files] + [(p, "split list") for p in self.side_files]
        return [{"path": str(p.resolve()), "format": fmt, "sha256": sha256_file(p)} for p, fmt in rows]

    @property
    def name(self) -> str:
        """The artifact's name in the workspace: coco, flickr or captions (CSV, JSON Lines, mixed)."""
        fmts = {fmt for _, fmt in self.files}
        if fmts <= {"karpathy", "coco"}:
            return "coco"
        return "flickr" if fmts <= {"karpathy", "flickr"} else "captions"


def hash_split(name: str) -> str:
    """The split of an image that no file assigns one: sha256 of its file name (without folders),
    its first 8 bytes as a big-endian integer, mod 10: 0 -> val, 1 -> test, else train (80/10/10).
    An image keeps its split when images are added or the files are reordered."""
    r = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % 10
    return "val" if r == 0 else "test" if r == 1 else "train"


def ids_from_names(names: Sequence[str | Path]) -> list[int]:
    """Image ids from file names: the digits that end each name's stem (COCO's ``000000000139.jpg``
    -> 139, Flickr30k's ``1000092795.jpg`` -> 1000092795) when every name has them and they are
    distinct, else 1..N in the order given. ``rdpp caption`` numbers photos by the same rule."""
    ids = []
    for n in names:
        m = re.search(r"(\d+)$", Path(n).stem)
        ids.append(int(m.group(1)) if m else None)
    if None in ids or len(set(ids)) != len(ids):
        return list(range(1, len(names) + 1))
    return ids


# -- recognising a file ---------------------------------------------------------------------------

def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise RdppError(f"{path}, line {line} is not UTF-8 text; save the caption file as UTF-8") from None


def _pick(keys, names: Sequence[str]) -> str | None:
    low = {str(k).strip().lower(): k for k in keys}
    return next((low[n] for n in names if n in low), None)


def _csv_columns(first_row: list[str]) -> dict[str, int] | None:
    """Column of each field from the header row (None when row 1 is no header: ``image,caption[,split]``
    by position when its first field names an image file, else not a caption CSV)."""
    cols = {}
    for what, names in (("image", IMAGE_KEYS), ("caption", CAPTION_KEYS), ("split", SPLIT_KEYS), ("id", ID_KEYS)):
        key = _pick(first_row, names)
        if key is not None:
            cols[what] = first_row.index(key)
    if "image" in cols and "caption" in cols:
        return cols
    if len(first_row) >= 2 and Path(first_row[0].strip()).suffix.lower() in IMAGE_SUFFIXES:
        return {"image": 0, "caption": 1, **({"split": 2} if len(first_row) > 2 else {}), "headerless": -1}
    return None


def detect(path: Path) -> tuple[str, object]:
    """The format of caption file ``path`` (one of karpathy, coco, flickr, csv, jsonl), recognised by
    its content, and its parsed JSON (karpathy, coco) or its text (the others)."""
    text = _read_text(path)
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if first.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # one JSON object per line
                return "jsonl", text
            raise RdppError(f"{path}, line {e.lineno} is not valid JSON (column {e.colno}: {e.msg}); "
                            "fix the file") from None
        if isinstance(data, dict) and isinstance(data.get("annotations"), list):
            return "coco", data
        if isinstance(data, dict) and isinstance(data.get("images"), list):
            return "karpathy", data
        if isinstance(data, dict) and _pick(data, IMAGE_KEYS) and _pick(data, CAPTION_KEYS):
            return "jsonl", text
    elif FLICKR_LINE.match(first):
        return "flickr", text
    elif first.strip() and _csv_columns(next(csv.reader([first]))) is not None:
        return "csv", text
    line = 1 + text[:text.find(first)].count("\n") if first else 1
    raise RdppError(f"{path}, line {line}: unknown caption file format; {FORMAT_HELP}")


# -- reading each format ---------------------------------------------------------------------------

def _add_caption(photos: dict[str, Photo], where: str, image: str, caption: str,
                 split: str | None = None, image_id: int | None = None) -> None:
    """One caption row: checked, then added to its image's entry (created on its first row)."""
    image, caption = image.strip(), " ".join(caption.split())
    if not image:
        raise RdppError(f"{where}: a caption with no image ({caption[:40]!r}); name the image file it describes")
    if not tokenize(caption):
        raise RdppError(f"{where}: image {image} has an empty caption (no letters or digits); remove the row "
                        "or write the caption")
    p = photos.get(image)
    if p is None:
        photos[image] = p = Photo(image, where, split=split, image_id=image_id)
    elif split != p.split:
        raise RdppError(f"{where}: image {image} has split {split or '(none)'} here but {p.split or '(none)'} at "
                        f"{p.where}; give every row of an image the same split")
    elif image_id != p.image_id:
        raise RdppError(f"{where}: image {image} has id {image_id} here but {p.image_id} at {p.where}; "
                        "give every row of an image the same id")
    p.captions.append(caption)


def _split_value(value, where: str) -> str | None:
    s = str(value).strip().lower() if value is not None else ""
    if not s:
        return None
    if s == "dev":  # Flickr8k's name for val
        return "val"
    if s not in KARPATHY_SPLITS:
        raise RdppError(f"{where}: split {value!r}; use one of {', '.join(KARPATHY_SPLITS)} (or leave it empty)")
    return s


def _id_value(value, where: str) -> int | None:
    if value is None or str(value).strip() == "":
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        raise RdppError(f"{where}: image id {value!r} is not an integer; give integer ids or none") from None


def _table_row(photos, where: str, get) -> None:
    """A CSV or JSON Lines row; ``get(what)`` reads field image/caption/split/id (None when absent)."""
    image, caption = get("image"), get("caption")
    _add_caption(photos, where, str(image or ""), str(caption or ""),
                 _split_value(get("split"), where), _id_value(get("id"), where))


def read_csv(path: Path, text: str) -> list[Photo]:
    reader = csv.reader(io.StringIO(text))
    photos: dict[str, Photo] = {}
    cols = None
    width, form = 0, ""  # the most fields a row may have: the header's, or image,caption,split without one
    for row in reader:
        if not any(c.strip() for c in row):
            continue
        if cols is None:
            cols = _csv_columns(row)
            width, form = (3, "image,caption,split form") if "headerless" in cols else (len(row), "header")
            if "headerless" not in cols:
                continue
        where = f"{path}, line {reader.line_num}"
        if any(c.strip() for c in row[width:]):
            raise RdppError(f"{where} has {len(row)} fields but the {form} has {width}; quote a caption that "
                            'holds commas ("a cat, on a mat")')
        _table_row(photos, where, lambda what: row[cols[what]] if what in cols and cols[what] < len(row)
                   else None)
    return list(photos.values())


def read_jsonl(path: Path, text: str) -> list[Photo]:
    photos: dict[str, Photo] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise RdppError(f"{where} is not valid JSON (column {e.colno}: {e.msg}); one object per line") from None
        if not isinstance(obj, dict):
            raise RdppError(f"{where} is not a JSON object; expected {{\"image\": ..., \"caption\": ...}}")
        keys = {"image": IMAGE_KEYS, "caption": CAPTION_KEYS, "split": SPLIT_KEYS, "id": ID_KEYS}
        _table_row(photos, where, lambda what: obj.get(_pick(obj, keys[what])))
    return list(photos.values())


def read_flickr(path: Path, text: str) -> list[Photo]:
    """A Flickr token file; with Flickr8k's split lists beside it, their splits (an image in none of
    them is left out, as Karpathy's Flickr8k split file leaves it out)."""
    photos: dict[str, Photo] = {}
    seen: dict[tuple[str, str], int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = FLICKR_LINE.match(line.rstrip("\r\n"))
        if m is None:
            raise RdppError(f"{path}, line {n} is not '<image>#<k><TAB><caption>'; fix or remove the line")
        key = (m["image"].strip(), m["k"])
        if key in seen and key[0]:
            raise RdppError(f"{path}, line {n}: caption id {key[0]}#{key[1]} appears twice (line {seen[key]} too); "
                            "caption ids must be unique")
        seen[key] = n
        _add_caption(photos, f"{path}, line {n}", m["image"], m["caption"])
    splits, _ = flickr_split_lists(path)
    if splits:
        for p in photos.values():
            p.split = splits.get(Path(p.name).name, LEFT_OUT)
    return list(photos.values())


def flickr_split_lists(token_file: Path) -> tuple[dict[str, str], list[Path]]:
    """Flickr8k's split lists beside ``token_file`` (``*trainImages.txt``, ``*devImages.txt``,
    ``*testImages.txt``): image file name -> split, and the list files."""
    splits, where, files = {}, {}, []
    for p in sorted(token_file.parent.iterdir()):
        split = next((s for end, s in FLICKR_LISTS.items() if p.name.lower().endswith(end)), None)
        if split is None or not p.is_file():
            continue
        files.append(p)
        for n, line in enumerate(_read_text(p).splitlines(), 1):
            name = line.strip()
            if name and splits.setdefault(name, split) != split:
                raise RdppError(f"{p}, line {n}: image {name} is also in {where[name]}; an image belongs to one split")
            where.setdefault(name, f"{p}, line {n}")
    return splits, files


def coco_split(path: Path, data: dict) -> str | None:
    """train/val/test when the COCO file's name (captions_train2017.json) or its info's description
    says so, else None."""
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    for text in (path.name, str(info.get("description", ""))):
        m = re.search(r"(?<![a-z])(train|val|test)(?:\d{4})?(?![a-z])", text.lower())
        if m:
            return m.group(1)
    return None


def read_coco(path: Path, data: dict) -> list[Photo]:
    """A COCO caption-annotation file: ``images`` [{id, file_name}] and ``annotations`` [{image_id, caption}]."""
    if not isinstance(data.get("images"), list):
        raise RdppError(f"{path} has 'annotations' but no 'images' list; pass COCO's captions_*.json as released")
    split, by_id = coco_split(path, data), {}
    for k, im in enumerate(data["images"]):
        where = f"{path}, images[{k}]"
        iid = im.get("id") if isinstance(im, dict) else None
        if isinstance(iid, bool) or not isinstance(iid, int):
            raise RdppError(f"{where} has no integer 'id'; every image needs one")
        if not isinstance(im.get("file_name"), str) or not im["file_name"].strip():
            raise RdppError(f"{where} (image {iid}) has no 'file_name'; the image file cannot be found")
        if iid in by_id:
            raise RdppError(f"{where}: image id {iid} appears twice ({by_id[iid].where} too); ids must be unique")
        by_id[iid] = Photo(im["file_name"].strip(), where, split=split, image_id=iid, coco=True)
    for k, a in enumerate(data["annotations"]):
        where = f"{path}, annotations[{k}]"
        iid, cap = (a.get("image_id"), a.get("caption")) if isinstance(a, dict) else (None, None)
        if iid not in by_id:
            raise RdppError(f"{where}: a caption of image {iid!r}, which the file's 'images' list does not have; "
                            "add the image or remove the caption")
        if not isinstance(cap, str) or not tokenize(cap):
            raise RdppError(f"{where}: image {iid} has an empty caption; remove it or write the caption")
        by_id[iid].captions.append(" ".join(cap.split()))
    for p in by_id.values():
        if not p.captions:
            raise RdppError(f"{p.where}: image {p.image_id} ({p.name}) has no caption in 'annotations'; "
                            "remove it from 'images' or add its captions")
    return list(by_id.values())


READERS = {"coco": read_coco, "flickr": read_flickr, "csv": read_csv, "jsonl": read_jsonl}


# -- where the images are --------------------------------------------------------------------------

def image_folders(path: Path, fmt: str, images_root: Path | None) -> list[Path]:
    """Folders a caption file's relative image names may start from, in the order tried: with
    ``--images-root R``, R (and R/<set> for a COCO file of set train2017, val2014, ...); without it,
    the caption file's folder for CSV and JSON Lines, the places the Flickr and COCO archives unpack
    to for theirs."""
    here = path.parent
    m = re.search(r"(train|val|test)\d{4}", path.name.lower()) if fmt == "coco" else None
    sets = [m.group(0)] if m else []
    if images_root is not None:
        return [images_root / s for s in sets] + [images_root]
    if fmt == "flickr":
        return [here] + [d / f for d in (here, here.parent) for f in FLICKR_FOLDERS]
    if fmt == "coco":  # annotations/captions_val2017.json beside val2017/, or images/val2017/
        return [d / s for d in (here, here.parent, here / "images", here.parent / "images") for s in sets] + \
               [here, here / "images", here.parent, here.parent / "images"]
    return [here]


def locate_images(path: Path, fmt: str, photos: list[Photo], images_root: Path | None,
                  need_files: bool) -> Path:
    """The folder the file's image names start from: the first of ``image_folders`` that holds its
    first image. With ``need_files`` every image must be there (one line naming the caption file's
    line otherwise)."""
    folders = image_folders(path, fmt, images_root)
    relative = next((p for p in photos if not Path(p.name).is_absolute()), None)
    base = folders[0]
    if relative is not None and need_files:
        base = next((f for f in folders if (f / relative.name).is_file()), None)
        if base is None:
            raise RdppError(f"{relative.where}: image {relative.name} is in none of {', '.join(map(str, folders))}; "
                            "pass --images-root DIR, the folder that holds the images")
    if need_files:
        for p in photos:
            if not (base / p.name).is_file():
                raise RdppError(f"{p.where}: image file {base / p.name} does not exist; fix the name, add the "
                                "file, or remove its captions")
    return base


# -- splits, ids, the dataset ------------------------------------------------------------------------

def karpathy_splits(path: Path, data: dict) -> dict:
    """Split of each image of a Karpathy split file, by file name (without folders) and by id."""
    by_name, by_id = {}, {}
    for img in data.get("images") or []:
        if isinstance(img, dict) and img.get("split") in KARPATHY_SPLITS:
            if isinstance(img.get("filename"), str):
                by_name[Path(img["filename"]).name] = img["split"]
            iid = img.get("cocoid", img.get("id"))
            if isinstance(iid, int):
                by_id[iid] = img["split"]
    if not by_name and not by_id:
        raise RdppError(f"{path} names no image with a split; pass a Karpathy split file (dataset_*.json)")
    return {"name": by_name, "id": by_id, "path": path}


def assign_splits(photos: list[Photo], split_file: dict | None) -> list[Photo]:
    """Each photo's split: from the Karpathy split file when one is given (a COCO image by its id, any
    other by its file name), else its own file's (CSV column, COCO file name, Flickr8k lists), else
    ``hash_split``. Photos left without a split (not in the split file, in no Flickr8k list) are
    left out, with a note."""
    kept, left = [], []
    by = f"the Karpathy split file {split_file['path']}" if split_file else "the Flickr8k split lists"
    for p in photos:
        name = Path(p.name).name
        if split_file is not None:
            p.split = split_file["id"].get(p.image_id) if p.coco else None
            p.split = p.split or split_file["name"].get(name, LEFT_OUT)
        elif p.split is None:
            p.split = hash_split(name)
        (left if p.split == LEFT_OUT else kept).append(p)
    if left:
        note(f"{len(left):,} image(s) are not in {by} (e.g. {left[0].name}, {left[0].where}): left out")
    if not kept:
        raise RdppError(f"no image of the caption files is in {by}; pass the split file made for these images")
    return kept


def assign_ids(photos: list[Photo]) -> None:
    """Ids the files do not give come from the file names (``ids_from_names``); every id unique."""
    need = [p for p in photos if p.image_id is None]
    for p, i in zip(need, ids_from_names([p.name for p in need])):
        p.image_id = i
    seen: dict[int, Photo] = {}
    for p in photos:
        if p.image_id in seen:
            raise RdppError(f"{p.where}: image id {p.image_id} of {p.name} is also the id of {seen[p.image_id].name} "
                            f"({seen[p.image_id].where}); ids must be unique")
        seen[p.image_id] = p


def to_dataset(photos: list[Photo]) -> dict:
    """The Karpathy-form dataset of the photos (``relpath`` set), tokenized as Karpathy's split files."""
    images = []
    for p in photos:
        filepath, _, filename = p.relpath.rpartition("/")
        images.append({"filepath": filepath, "filename": filename, ("cocoid" if p.coco else "id"): p.image_id,
                       "split": p.split, "sentences": [{"tokens": tokenize(c), "raw": c} for c in p.captions]})
    return {"images": images}


def read_caption_files(paths: Sequence[Path | str], images_root: Path | str | None = None, *,
                       need_files: bool = True) -> CaptionSource:
    """Recognise and read every caption file; one Karpathy-form dataset of them all. A lone Karpathy
    JSON is taken as it is; beside other files it gives their splits. Raises ``RdppError`` (one
    line naming the file and the line) on the first problem; writes nothing."""
    paths = [Path(p) for p in paths]
    for p in paths:
        if not p.is_file():
            raise RdppError(f"caption file {p} does not exist; pass --captions FILE for each caption file")
    root = Path(images_root) if images_root is not None else None
    if root is not None and not root.is_dir():
        raise RdppError(f"--images-root {root} is not a folder; pass the folder holding the images")
    parsed = [(p, *detect(p)) for p in paths]
    karpathy = [(p, d) for p, fmt, d in parsed if fmt == "karpathy"]
    if len(karpathy) > 1:
        raise RdppError(f"{karpathy[0][0]} and {karpathy[1][0]} are both Karpathy split files; pass one")
    if len(karpathy) == len(parsed):
        return CaptionSource([(karpathy[0][0], "karpathy")], karpathy[0][1], derived=False)
    photos, bases, side = [], [], []
    for p, fmt, content in parsed:
        if fmt == "karpathy":
            continue
        found = READERS[fmt](p, content)
        if not found:
            raise RdppError(f"{p} holds no captions; {FORMAT_HELP}")
        bases.append(locate_images(p, fmt, found, root, need_files))
        side += flickr_split_lists(p)[1] if fmt == "flickr" else []
        photos += [(f, bases[-1]) for f in found]
    # absolute paths without resolving links: a linked photo keeps its name under the root
    top = root or Path(os.path.commonpath([os.path.abspath(b) for b in bases]))
    for f, base in photos:
        f.relpath = Path(os.path.relpath(os.path.abspath(base / f.name), os.path.abspath(top))).as_posix()
    _no_image_twice([f for f, _ in photos])
    found = [f for f, _ in photos]
    assign_ids(found)
    kept = assign_splits(found, karpathy_splits(*karpathy[0]) if karpathy else None)
    files = [(p, fmt) for p, fmt, _ in parsed]
    return CaptionSource(files, to_dataset(kept), derived=True, images_root=top if root is None else root,
                         side_files=side)


def _no_image_twice(photos: list[Photo]) -> None:
    seen: dict[str, Photo] = {}
    for p in photos:
        if p.relpath in seen:
            raise RdppError(f"{p.where}: image {p.name} is also named at {seen[p.relpath].where}; give each image's "
                            "captions in one file")
        seen[p.relpath] = p
