"""`rdpp prepro coco|toy`: the commands made from ``PreproCocoOptions`` and ``PreproToyOptions``
(rdpp_cli.data.options); the work is ``rdpp_cli.data.prepro.prepro_coco`` and ``rdpp_cli.data.toy.prepro_toy``."""

from __future__ import annotations

import typer

from rdpp_cli.cli.common import command_for
from rdpp_cli.data.options import PreproCocoOptions, PreproToyOptions

app = typer.Typer(
    help="Make a data artifact (vocabulary, captions, image features, CIDEr df) from COCO or the bundled "
    "synthetic set. Example: rdpp prepro toy",
    no_args_is_help=True,
)

coco = command_for(PreproCocoOptions, "rdpp_cli.data.prepro:prepro_coco", """Caption files + images -> data artifact. Resumes an interrupted extraction when rerun.

    Example (Karpathy split): rdpp prepro coco --karpathy-json data/coco/dataset_coco.json --images-root data/coco/images --weights resnet101.pth

    Example (COCO's files): rdpp prepro coco --captions annotations/captions_train2017.json --captions annotations/captions_val2017.json --images-root coco/

    Example (Flickr8k): rdpp prepro coco --captions Flickr8k_text/Flickr8k.token.txt --images-root Flicker8k_Dataset

    Example (Flickr30k): rdpp prepro coco --captions results_20130124.token --images-root flickr30k-images

    Example (your own photos): rdpp prepro coco --captions mine.csv (image,caption[,split] rows; or mine.jsonl)
    """)

toy = command_for(PreproToyOptions, "rdpp_cli.data.toy:prepro_toy", """The bundled synthetic set (coloured shapes, 5 different references each) -> data artifact.

    Example: rdpp prepro toy --images 3000 --seed 0
    """)

app.command("coco")(coco)
app.command("toy")(toy)
