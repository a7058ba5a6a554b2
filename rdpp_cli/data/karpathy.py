"""Read and check a Karpathy-split caption file (``dataset_coco.json``).

Format (Karpathy & Fei-Fei's release): ``{"images": [{"filepath", "filename", "cocoid", "split",
"sentences": [{"tokens": [...], "raw": "..."}]}]}``. ``split`` is train, restval, val or test.
Everything is checked up front, so a bad file stops the stage before anything is written.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.errors import RdppError

KARPATHY_SPLITS = ("train", "restval", "val", "test")
# Karpathy's split file keeps lower-case letters and digits and splits at everything else
# ("bear's" -> "bear s", "upside-down" -> "upside down"): equal to its tokens for every sentence of
# the 390 real COCO photos' captions (tests/test_real_photos.py, where that data is present).
# Letters and digits of any script count (a word's combining marks with it): "Mädchen" is one word,
# as neuraltalk2's prepro, which strips ASCII punctuation only.
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ImageRecord:
    """One image of the caption file: id, relative path, split and tokenized references."""

    image_id: int
    relpath: str  # filepath/filename, relative to the image root ("" when the JSON names no file)
    split: str  # train, val or test (restval joins train by default; otherwise it is left out)
    captions: tuple[tuple[str, ...], ...]
    # each caption as the person wrote it (the sentence's ``raw``; the joined tokens when it has none):
    # the references for scoring, tokenized by coco-caption's PTB tokenizer as the peers do
    raws: tuple[str, ...] = ()


def tokenize(raw: str) -> list[str]:
    """Karpathy-style tokens for a sentence given only as ``raw``: lower case, letters and digits
    (of any script, Unicode NFKC-normalised, combining marks kept with their letter) only, split at
    everything else (punctuation, apostrophes, hyphens, symbols). Text in a script written without
    spaces (Chinese, Japanese) comes out as one word per run: segment it into words first."""
    if raw.isascii():
        return _TOKEN.findall(raw.lower())
    words, word = [], []
    for ch in unicodedata.normalize("NFKC", raw).lower():
        if ch.isalnum() or unicodedata.category(ch)[0] == "M":
            word.append(ch)
        elif word:
            words.append("".join(word))
            word = []
    return words + (["".join(word)] if word else [])


def load_karpathy(path: Path | str, restval_to_train: bool = True, need_files: bool = True) -> list[ImageRecord]:
    """Every image of a Karpathy JSON, in file order, checked.

    Raises ``RdppError`` (one line naming the file, the image and what to do) for a missing or
    malformed file, a file without an ``images`` list, an unknown split, duplicate ids, an image
    without captions or with an empty caption.
    """
    path = Path(path)
    if not path.is_file():
        raise RdppError(f"Karpathy caption file {path} does not exist; pass --karpathy-json PATH (dataset_coco.json)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise RdppError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                        "pass the Karpathy split file dataset_coco.json") from None
    except UnicodeDecodeError:
        raise RdppError(f"{path} is not UTF-8 text; pass the Karpathy split file dataset_coco.json") from None
    return records_from_dataset(data, path, restval_to_train, need_files)


def records_from_dataset(data, path: Path | str, restval_to_train: bool = True,
                         need_files: bool = True) -> list[ImageRecord]:
    """Every image of a Karpathy-form dataset already in memory (``{"images": [...]}``), in order,
    checked as ``load_karpathy`` checks a file; ``path`` names it in errors. The one reader of
    ``--karpathy-json`` and of the datasets ``caption_files`` derives from other caption files."""
    path = Path(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise RdppError(f"{path} has no 'images' list; expected the Karpathy format "
                        "{{\"images\": [{{\"filename\", \"cocoid\", \"split\", \"sentences\"}}]}}")
    if not data["images"]:
        raise RdppError(f"{path} lists no images; pass a Karpathy split file with images")
    records, seen = [], {}
    for k, img in enumerate(data["images"]):
        records.append(_record(path, k, img, restval_to_train, need_files))
        rid = records[-1].image_id
        if rid in seen:
            raise RdppError(f"{path}: image id {rid} appears twice (images {seen[rid]} and {k}); ids must be unique")
        seen[rid] = k
    if not restval_to_train:  # restval images then belong to no split rdpp uses: leave them out
        records = [r for r in records if r.split != "restval"]
    return records


def _record(path: Path, k: int, img, restval_to_train: bool, need_files: bool) -> ImageRecord:
    where = f"{path}, images[{k}]"
    if not isinstance(img, dict):
        raise RdppError(f"{where} is not an object; expected {{\"filename\", \"cocoid\", \"split\", \"sentences\"}}")
    image_id = img.get("cocoid", img.get("id", img.get("imgid")))
    if isinstance(image_id, bool) or not isinstance(image_id, int):
        raise RdppError(f"{where} has no integer 'cocoid' (nor 'id'/'imgid'); every image needs an id")
    where = f"{path}, image {image_id}"
    split = img.get("split")
    if split not in KARPATHY_SPLITS:
        raise RdppError(f"{where} has split {split!r}; expected one of {', '.join(KARPATHY_SPLITS)}")
    if split == "restval" and restval_to_train:
        split = "train"
    filename = img.get("filename")
    if need_files and not (isinstance(filename, str) and filename):
        raise RdppError(f"{where} has no 'filename'; the image file cannot be found")
    relpath = "/".join(p for p in (img.get("filepath") or "", filename or "") if p)
    sentences = img.get("sentences")
    if not isinstance(sentences, list) or not sentences:
        raise RdppError(f"{where} has no 'sentences'; every image needs at least one reference caption")
    caps, raws = [], []
    for j, s in enumerate(sentences):
        tokens = s.get("tokens") if isinstance(s, dict) else None
        if tokens is None and isinstance(s, dict) and isinstance(s.get("raw"), str):
            tokens = tokenize(s["raw"])
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise RdppError(f"{where}, sentence {j} has no 'tokens' list of strings (nor 'raw' text)")
        tokens = [t for t in (t.strip() for t in tokens) if t]
        if any(any(c.isspace() for c in t) for t in tokens):
            raise RdppError(f"{where}, sentence {j} has a token containing whitespace; tokens must be single words")
        if not tokens:
            raise RdppError(f"{where} has an empty caption (sentence {j}); remove it or give it tokens")
        caps.append(tuple(tokens))
        raw = s.get("raw")
        raws.append(" ".join(raw.split()) if isinstance(raw, str) and raw.strip() else " ".join(tokens))
    return ImageRecord(int(image_id), relpath, split, tuple(caps), tuple(raws))
