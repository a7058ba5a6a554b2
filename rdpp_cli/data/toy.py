"""``rdpp prepro toy``: the bundled synthetic captioning set (docs/data.md), generated with Pillow.

Each 64×64 image holds 1–3 shapes (circle, square, triangle; red, green, blue, yellow, purple;
small or large), each in its own cell of a 3×3 layout, on a white background. Each image gets 5
references from 5 different templates of a small grammar, so that the references are genuinely
different correct descriptions (what they mention, in which order, at which level of detail):

- list:     "a red circle and a blue square"
- count:    "two shapes on a white background" / "there are two shapes in the image"
- relation: "a red circle above a blue square" / "a blue square below a red circle"
            / "... to the left of ..." (two or more shapes)
- detail:   "a small red circle in the top left corner"
- kinds:    "a picture of two circles and a square"
- colours:  "a red shape and two blue shapes"

The set is written in Karpathy form (``source/dataset_toy.json`` + ``source/images/<id>.png``,
inside the artifact) and then goes through the very same code as ``rdpp prepro coco``. Image ``i``
depends only on (seed, i), so ``--images 200`` gives the first 200 images of the default set.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from rdpp_cli.artifacts import Artifact, atomic_write_bytes
from rdpp_cli.artifacts.files import figure_bytes
from rdpp_cli.console import info, progress
from rdpp_cli.data.options import PreproCocoOptions, PreproToyOptions
from rdpp_cli.data.prepro import claim_output, plan_prepro, weights_ref, write_data_artifact
from rdpp_cli.options import takes

GENERATOR = "toy-shapes-1"  # bump when the drawing or the grammar changes
IMAGE_SIZE = 64
GRID = 3  # layout cells per side; each shape sits in its own cell
KINDS = ("circle", "square", "triangle")
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (150, 60, 190),
}
SIZES = {"small": 5, "large": 9}  # radius in pixels
NUMBER = {1: "a", 2: "two", 3: "three"}
ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
PLACE = {  # (row, col) -> where a shape is, as words
    (0, 0): "in the top left corner", (0, 1): "at the top", (0, 2): "in the top right corner",
    (1, 0): "on the left", (1, 1): "in the center", (1, 2): "on the right",
    (2, 0): "in the bottom left corner", (2, 1): "at the bottom", (2, 2): "in the bottom right corner",
}
TEMPLATES = ("list", "count", "relation", "detail", "kinds", "colours")
REFS_PER_IMAGE = 5
SOURCE_DIR = "source"
JSON_NAME = "dataset_toy.json"


@dataclass(frozen=True)
class Shape:
    kind: str
    colour: str
    size: str
    row: int
    col: int
    x: float  # centre, pixels
    y: float

    def words(self, colour: bool = True, size: bool = False, kind: bool = True) -> list[str]:
        return ["a"] + ([self.size] if size else []) + ([self.colour] if colour else []) + \
            [self.kind if kind else "shape"]


def draw_shapes(rng: np.random.Generator) -> list[Shape]:
    """1–3 shapes in distinct layout cells, in reading order (top to bottom, left to right)."""
    n = int(rng.integers(1, 4))
    cells = sorted(rng.choice(GRID * GRID, size=n, replace=False).tolist())
    cell = IMAGE_SIZE / GRID
    shapes = []
    for c in cells:
        row, col = divmod(c, GRID)
        size = str(rng.choice(list(SIZES)))
        room = cell / 2 - SIZES[size] - 1
        x = (col + 0.5) * cell + rng.uniform(-room, room)
        y = (row + 0.5) * cell + rng.uniform(-room, room)
        shapes.append(Shape(str(rng.choice(KINDS)), str(rng.choice(list(COLOURS))), size, row, col,
                            round(float(x), 2), round(float(y), 2)))
    return shapes


def render(shapes: list[Shape], rng: np.random.Generator):
    """A 64×64 RGB Pillow image of ``shapes`` (colours jittered a little per shape)."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
    d = ImageDraw.Draw(im)
    for s in shapes:
        fill = tuple(int(np.clip(v + rng.integers(-15, 16), 0, 255)) for v in COLOURS[s.colour])
        r = SIZES[s.size]
        if s.kind == "circle":
            d.ellipse([s.x - r, s.y - r, s.x + r, s.y + r], fill=fill)
        elif s.kind == "square":
            q = r * 0.85  # about the circle's area
            d.rectangle([s.x - q, s.y - q, s.x + q, s.y + q], fill=fill)
        else:
            d.polygon([(s.x, s.y - r), (s.x - r, s.y + r * 0.8), (s.x + r, s.y + r * 0.8)], fill=fill)
    return im


def _join(phrases: list[list[str]]) -> list[str]:
    """["a red circle"], ["a blue square"], ... -> "a red circle a blue square and a green triangle"."""
    out: list[str] = []
    for k, p in enumerate(phrases):
        if k == len(phrases) - 1 and k > 0:
            out.append("and")
        out += p
    return out


def _grouped(counter: Counter, noun) -> list[list[str]]:
    return [[NUMBER[c]] + noun(key, c) for key, c in counter.items()]


def caption(template: str, shapes: list[Shape], rng: np.random.Generator) -> list[str]:
    """One description of ``shapes`` following ``template`` (random choices from ``rng``)."""
    n = len(shapes)
    if template == "list":
        sizes = bool(rng.random() < 0.3)
        order = rng.permutation(n)
        return _join([shapes[i].words(size=sizes) for i in order])
    if template == "count":
        what = ["a", "single", "shape"] if n == 1 else [NUMBER[n], "shapes"]
        if rng.random() < 0.5:
            return what + ["on", "a", "white", "background"]
        return ["there", "is" if n == 1 else "are"] + what + ["in", "the", "image"]
    if template == "relation":
        i, j = sorted(rng.choice(n, size=2, replace=False).tolist())  # reading order: i before j
        a, b = shapes[i], shapes[j]
        if a.row != b.row:  # a is higher
            rel, inverse = ["above"], ["below"]
        else:  # same row: a is to the left
            rel, inverse = ["to", "the", "left", "of"], ["to", "the", "right", "of"]
        if rng.random() < 0.5:
            return a.words() + rel + b.words()
        return b.words() + inverse + a.words()
    if template == "detail":
        s = shapes[int(rng.integers(n))]
        return s.words(size=True) + PLACE[(s.row, s.col)].split()
    if template == "kinds":
        kinds = Counter(s.kind for s in shapes)
        order = list(kinds)
        rng.shuffle(order)
        return ["a", "picture", "of"] + _join(_grouped(Counter({k: kinds[k] for k in order}),
                                                       lambda k, c: [k if c == 1 else PLURAL[k]]))
    if template == "colours":
        colours = Counter(s.colour for s in shapes)
        order = list(colours)
        rng.shuffle(order)
        return _join(_grouped(Counter({k: colours[k] for k in order}),
                              lambda k, c: [k, "shape" if c == 1 else "shapes"]))
    raise ValueError(f"unknown template {template!r}")


def applicable(shapes: list[Shape]) -> list[str]:
    return [t for t in TEMPLATES if t != "relation" or len(shapes) >= 2]


def references(shapes: list[Shape], rng: np.random.Generator) -> list[tuple[str, list[str]]]:
    """5 references from 5 different templates (with replacement only if fewer apply)."""
    temps = applicable(shapes)
    chosen = rng.choice(temps, size=REFS_PER_IMAGE, replace=len(temps) < REFS_PER_IMAGE).tolist()
    return [(t, caption(t, shapes, rng)) for t in chosen]


def split_sizes(n: int) -> tuple[int, int, int]:
    """(train, val, test): 10 % each for val and test, at least one image each."""
    held = max(1, round(n * 0.1))
    return n - 2 * held, held, held


def generate_toy(root: Path, images: int = 3000, seed: int = 0) -> Path:
    """Write ``root/images/<id>.png`` and ``root/dataset_toy.json`` (Karpathy form; each image also
    carries its ``shapes`` and each sentence its ``template``). Returns the JSON path."""
    root = Path(root)
    if root.exists():  # an unfinished or other source: start over (never mix two sets)
        shutil.rmtree(root)
    (root / "images").mkdir(parents=True)
    n_train, n_val, _ = split_sizes(images)
    entries, sentid = [], 0
    with progress("images") as bar:
        task = bar.add_task("draw toy images", total=images, info="")
        for i in range(images):
            rng = np.random.default_rng([seed, i])
            shapes = draw_shapes(rng)
            image_id = i + 1
            filename = f"{image_id:06d}.png"
            image = render(shapes, rng)
            atomic_write_bytes(root / "images" / filename,
                               figure_bytes(partial(image.save, format="PNG", compress_level=1)), durable=False)
            sents = []
            for template, tokens in references(shapes, rng):
                sents.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": i, "sentid": sentid,
                              "template": template})
                sentid += 1
            split = "train" if i < n_train else "val" if i < n_train + n_val else "test"
            entries.append({"filepath": "images", "filename": filename, "imgid": i, "cocoid": image_id,
                            "split": split, "sentids": [s["sentid"] for s in sents], "sentences": sents,
                            "shapes": [s.__dict__ for s in shapes]})
            bar.advance(task)
    path = root / JSON_NAME
    atomic_write_bytes(path, json.dumps({"dataset": "toy", "generator": GENERATOR, "seed": seed,
                                         "images": entries}, separators=(",", ":"), allow_nan=False).encode())
    return path


@takes(PreproToyOptions)
def prepro_toy(opts: PreproToyOptions) -> Artifact:
    """Generate the bundled set and run it through ``prepro coco``'s code: ``<workspace>/data/toy-v<k>``
    or ``out``. A torchvision ``backbone`` starts from random weights unless ``weights`` is given; its
    images are upscaled to ``image_size`` (128 by default, a 4×4 map for a stride-32 CNN)."""
    from rdpp_cli.data.backbones import HF_PREFIX, build_backbone

    image_size = opts.image_size or (IMAGE_SIZE if opts.backbone == "pixstats" else
                                     None if opts.backbone.startswith(HF_PREFIX) else 2 * IMAGE_SIZE)
    bb = build_backbone(opts.backbone, att_size=opts.att_size, image_size=image_size, weights=opts.weights,
                        pretrained=False)
    image_size = bb.image_size  # a Hugging Face encoder's is its image processor's
    text = {"word_count_threshold": 5, "max_length": 16, "dtype": "float16"}  # fixed: the set's own vocabulary
    config = {"source": "toy", "images": opts.images, "seed": opts.seed, "generator": GENERATOR,
              "backbone": bb.name, "att_size": bb.att_size, "image_size": image_size,
              "weights": weights_ref(opts.weights, opts.out, opts.workspace), "weights_sha256": bb.weights_sha256,
              **text, "batch_size": opts.batch_size}
    out_dir = claim_output(opts.out, workspace=opts.workspace, name="toy", config=config, force=opts.force,
                           reads=[opts.weights])
    info(f"writing the toy data artifact to [bold]{out_dir}[/bold]")
    src = out_dir / SOURCE_DIR
    json_path = src / JSON_NAME
    if not _source_ok(json_path, opts.images, opts.seed):
        generate_toy(src, images=opts.images, seed=opts.seed)
    plan = plan_prepro(PreproCocoOptions(json_path, images_root=src, backbone=opts.backbone, att_size=opts.att_size,
                                         weights=opts.weights, pretrained=False, device="cpu",
                                         batch_size=opts.batch_size, workers=0, image_size=image_size, **text))
    return write_data_artifact(out_dir, plan, config, title="rdpp prepro toy", keep=(SOURCE_DIR,))


def _source_ok(json_path: Path, images: int, seed: int) -> bool:
    """A source left by an interrupted run with the same settings (the JSON is written last)."""
    if not json_path.is_file():
        return False
    try:
        data = json.loads(json_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return data.get("generator") == GENERATOR and data.get("seed") == seed and len(data.get("images", [])) == images
