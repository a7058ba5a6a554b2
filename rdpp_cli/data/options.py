"""The options of `rdpp prepro coco` and `rdpp prepro toy`, declared once (rdpp_cli.options). Their
``rdpp.yaml`` sections are ``prepro_coco`` and ``prepro_toy``. No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdpp_cli.errors import RdppError
from rdpp_cli.options import Options, at_least, force_option, option, workspace_option
from rdpp_cli.options import seed as seed_check

FEATURE_DTYPES = ("float16", "float32")  # features.h5's storage types
TOY_MIN_IMAGES = 10  # 10 % each go to val and test


def parse_threshold(value: int | str) -> int | None:
    """``--word-count-threshold``: a count >= 0, or ``auto`` (None: decided from the training set)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    try:
        t = int(value)
    except (TypeError, ValueError):
        raise RdppError(f"--word-count-threshold {value!r} is neither a count nor 'auto'; "
                        "pass e.g. 5 (keep words seen more than 5 times in train) or auto") from None
    if t < 0:
        raise RdppError(f"--word-count-threshold {t} must be 0 or more (or auto)")
    return t


def _toy_images(flag: str, value: int) -> None:
    if value < TOY_MIN_IMAGES:
        raise RdppError(f"{flag} {value} is too few; use at least {TOY_MIN_IMAGES} (10 % each go to val and test)")


def out_here() -> Any:
    """``--out`` of both prepro commands."""
    return option(None, "Write exactly here instead of a new version under <workspace>/data.", identity=False,
                  record=False, positional=True, cli={"file_okay": False})


@dataclass
class PreproCocoOptions(Options):
    """`rdpp prepro coco`: caption files + images -> a data artifact. ``prepro_coco(karpathy_json,
    images_root, out, ...)`` takes the first three positionally."""

    section = "prepro_coco"

    karpathy_json: Path | None = option(
        None, "Karpathy split file dataset_coco.json (default: $RDPP_COCO_ROOT/dataset_coco.json, then "
        "./data/coco/dataset_coco.json). Beside --captions files: their splits.", positional=True,
        cli={"dir_okay": False})
    captions: list[Path] | None = option(
        None, "Caption file, repeatable, recognised by its content: a Karpathy JSON, COCO captions_*.json, a "
        "Flickr token file (Flickr8k.token.txt, results_20130124.token), or CSV/JSON Lines of "
        "image,caption[,split] (docs/data.md, Caption files).", cli={"dir_okay": False, "metavar": "FILE"})
    images_root: Path | None = option(
        None, "Folder the caption file's image paths start from (for COCO the one holding train2014/, val2014/) "
        "(default: for a Karpathy JSON the first of $RDPP_COCO_ROOT/images, $RDPP_COCO_ROOT, ./data/coco/images, "
        "./data/coco that holds the first image; for --captions the caption file's folder and the folders "
        "the COCO and Flickr archives unpack to).", positional=True, cli={"file_okay": False})
    out: Path | None = out_here()
    force: bool = force_option()
    word_count_threshold: str = option(
        "auto", "Keep words seen more than this many times in train; auto: 5 for a COCO-sized training set, "
        "scaled down with its size, at least 1 (docs/data.md).", check=lambda flag, value: parse_threshold(value))
    max_length: int = option(16, "Clip captions to this many tokens.", check=at_least(1))
    restval_to_train: bool = option(True, "restval images join train (else they are left out).",
                                    "--restval-to-train/--no-restval-to-train")
    backbone: str = option("resnet101", "torchvision CNN name, pixstats, or hf:DIR (the vision encoder of a Hugging "
                           "Face captioner's save_pretrained folder: its last hidden states are att).")
    att_size: int = option(14, "att grid side G: att has G*G cells.")
    weights: Path | None = option(None, "Local state_dict for the backbone.", cli={"dir_okay": False})
    pretrained: bool = option(True, "ImageNet weights (from torch's hub cache; no download), else random init.",
                              "--pretrained/--no-pretrained")
    device: str = option("auto", "auto, cpu, cuda or cuda:N.", identity=False)
    batch_size: int = option(32, "Images per batch (also the resume/hash block).", check=at_least(1))
    workers: int | None = option(None, "Processes decoding images (default: on a GPU the cores but one, at most 8; "
                                 "on a CPU a quarter of them).", identity=False, check=at_least(0))
    dtype: str = option("float16", "Storage type of the features.", choices=FEATURE_DTYPES)
    features_from: Path | None = option(
        None, "Import region features (HDF5, or folder of <id>.npy/.npz) instead of running a CNN.")
    image_size: int | None = option(None, "Resize images to this square size (default: 448; 64 for pixstats).")
    workspace: Path | None = workspace_option()


@dataclass
class PreproToyOptions(Options):
    """`rdpp prepro toy`: the bundled synthetic set -> a data artifact. ``prepro_toy(out, ...)``."""

    section = "prepro_toy"

    out: Path | None = out_here()
    images: int = option(3000, "Number of images (10 % each for val and test).", check=_toy_images)
    seed: int = option(0, "Image i depends only on (seed, i).", check=seed_check)
    backbone: str = option("pixstats", "pixstats, a torchvision CNN (random init unless --weights), or hf:DIR (a "
                           "Hugging Face captioner's vision encoder).")
    att_size: int = option(8, "att grid side G: att has G*G cells.")
    weights: Path | None = option(None, "Local state_dict for a CNN backbone.", cli={"dir_okay": False})
    image_size: int | None = option(None, "Feature input size (default: 64 for pixstats, 128 for a CNN).")
    batch_size: int = option(100, "Images per batch (also the resume/hash block).", check=at_least(1))
    force: bool = force_option()
    workspace: Path | None = workspace_option()
