"""`rdpp prepro coco|toy`: make a data artifact (vocabulary, captions, features, CIDEr df)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from rdpp_cli.cli.common import ConfigOpt, ForceOpt, WorkspaceOpt, resolve_options, stage

app = typer.Typer(
    help="Make a data artifact (vocabulary, captions, image features, CIDEr df) from COCO or the bundled "
    "synthetic set. Example: rdpp prepro toy",
    no_args_is_help=True,
)


class Dtype(str, Enum):
    float16 = "float16"
    float32 = "float32"


OutOpt = typer.Option(None, "--out", help="Write exactly here instead of a new version under <workspace>/data.",
                      file_okay=False)


@app.command("coco")
@stage
def coco(
    ctx: typer.Context,
    karpathy_json: Path = typer.Option(
        None, "--karpathy-json", dir_okay=False,
        help="Karpathy split file dataset_coco.json (default: $RDPP_COCO_ROOT/dataset_coco.json, then "
             "./data/coco/dataset_coco.json). Beside --captions files: their splits."),
    captions: list[Path] = typer.Option(
        None, "--captions", dir_okay=False, metavar="FILE",
        help="Caption file, repeatable, recognised by its content: a Karpathy JSON, COCO captions_*.json, a "
             "Flickr token file (Flickr8k.token.txt, results_20130124.token), or CSV/JSON Lines of "
             "image,caption[,split] (docs/data.md, Caption files)."),
    images_root: Path = typer.Option(
        None, "--images-root", file_okay=False,
        help="Folder the caption file's image paths start from (for COCO the one holding train2014/, val2014/) "
             "(default: for a Karpathy JSON the first of $RDPP_COCO_ROOT/images, $RDPP_COCO_ROOT, ./data/coco/images, "
             "./data/coco that holds the first image; for --captions the caption file's folder and the folders "
             "the COCO and Flickr archives unpack to)."),
    out: Path = OutOpt,
    force: bool = ForceOpt,
    word_count_threshold: str = typer.Option(
        "auto", help="Keep words seen more than this many times in train; auto: 5 for a COCO-sized training set, "
                     "scaled down with its size, at least 1 (docs/data.md)."),
    max_length: int = typer.Option(16, help="Clip captions to this many tokens."),
    restval_to_train: bool = typer.Option(True, "--restval-to-train/--no-restval-to-train",
                                          help="restval images join train (else they are left out)."),
    backbone: str = typer.Option("resnet101", help="torchvision CNN name, or pixstats."),
    att_size: int = typer.Option(14, help="att grid side G: att has G*G cells."),
    weights: Path = typer.Option(None, dir_okay=False, help="Local state_dict for the backbone."),
    pretrained: bool = typer.Option(True, "--pretrained/--no-pretrained",
                                    help="ImageNet weights (from torch's hub cache; no download), else random init."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    batch_size: int = typer.Option(32, help="Images per batch (also the resume/hash block)."),
    workers: int = typer.Option(None, help="Processes decoding images (default: on a GPU the cores but one, at most 8; on a CPU a quarter of them)."),
    dtype: Dtype = typer.Option(Dtype.float16, help="Storage type of the features."),
    features_from: Path = typer.Option(None, help="Import region features (HDF5, or folder of <id>.npy/.npz) "
                                                  "instead of running a CNN."),
    image_size: int = typer.Option(None, help="Resize images to this square size (default: 448; 64 for pixstats)."),
    workspace: Path = WorkspaceOpt,
    config: Path = ConfigOpt,
) -> None:
    """Caption files + images -> data artifact. Resumes an interrupted extraction when rerun.

    Example (Karpathy split): rdpp prepro coco --karpathy-json data/coco/dataset_coco.json --images-root data/coco/images --weights resnet101.pth

    Example (COCO's files): rdpp prepro coco --captions annotations/captions_train2017.json --captions annotations/captions_val2017.json --images-root coco/

    Example (Flickr8k): rdpp prepro coco --captions Flickr8k_text/Flickr8k.token.txt --images-root Flicker8k_Dataset

    Example (Flickr30k): rdpp prepro coco --captions results_20130124.token --images-root flickr30k-images

    Example (your own photos): rdpp prepro coco --captions mine.csv (image,caption[,split] rows; or mine.jsonl)
    """
    from rdpp_cli.data.prepro import prepro_coco

    opts = resolve_options(ctx, "prepro_coco")
    opts["dtype"] = Dtype(opts["dtype"]).value
    prepro_coco(**opts)


@app.command("toy")
@stage
def toy(
    ctx: typer.Context,
    out: Path = OutOpt,
    images: int = typer.Option(3000, help="Number of images (10 % each for val and test)."),
    seed: int = typer.Option(0, help="Image i depends only on (seed, i)."),
    backbone: str = typer.Option("pixstats", help="pixstats, or a torchvision CNN (random init unless --weights)."),
    att_size: int = typer.Option(8, help="att grid side G: att has G*G cells."),
    weights: Path = typer.Option(None, dir_okay=False, help="Local state_dict for a CNN backbone."),
    image_size: int = typer.Option(None, help="Feature input size (default: 64 for pixstats, 128 for a CNN)."),
    batch_size: int = typer.Option(100, help="Images per batch (also the resume/hash block)."),
    force: bool = ForceOpt,
    workspace: Path = WorkspaceOpt,
    config: Path = ConfigOpt,
) -> None:
    """The bundled synthetic set (coloured shapes, 5 different references each) -> data artifact.

    Example: rdpp prepro toy --images 3000 --seed 0
    """
    from rdpp_cli.data.toy import prepro_toy

    prepro_toy(**resolve_options(ctx, "prepro_toy"))
