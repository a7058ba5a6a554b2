"""Image feature backbones: a module mapping images (B, 3, H, W) to ``fc`` (B, D) and ``att`` (B, G*G, D).

- Any torchvision classification model with a convolutional trunk (``resnet101`` by default): the
  trunk is the model without its pooling/classifier head; ``fc`` is the global average of its last
  feature map, ``att`` the map adaptive-average-pooled to a G×G grid.
- ``pixstats``: raw pixel statistics on a G×G grid, for the bundled synthetic set where no
  pretrained weights exist (see docs/data.md for why it beats a random CNN there).

Weights: ``--weights PATH`` (a local state_dict), else the ImageNet weights if they are already in
torch's hub cache, else an error asking for ``--weights`` or ``--no-pretrained`` (random init, from
a fixed seed so that reruns and resumed runs use the same model): nothing is downloaded. The head is
dropped, so a state_dict that lacks only head keys (a "features-only" trunk) is accepted and the
missing keys are recorded (``Backbone.missing_head``); one that lacks any trunk key is refused. The
file's sha256 is recorded too, so ``rdpp caption`` can check it extracts with the very same weights.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rdpp_cli.errors import RdppError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_HEAD_NAMES = {"avgpool", "fc", "classifier", "dropout", "head", "heads", "flatten", "norm", "permute"}
_NOT_CONV = ("vit_", "swin")
HF_PREFIX = "hf:"  # --backbone hf:DIR: a Hugging Face captioner's vision encoder


@dataclass
class Backbone:
    """A feature extractor and how images must be prepared for it."""

    name: str
    module: nn.Module  # (B, 3, S, S) float -> (fc (B, D), att (B, G*G, D))
    dim: int  # D
    att_size: int  # G
    image_size: int  # S: images are resized to S×S
    mean: tuple[float, float, float] | None  # per-channel normalisation after scaling to [0, 1]
    std: tuple[float, float, float] | None
    weights: str  # where the weights came from: "imagenet (hub cache)", a path, "random init", "none"
    threads: int | None = None  # torch threads while extracting (None: torch's default)
    # images per forward pass on a CPU, in channels-last layout (None: the whole batch, as on a GPU).
    # A CNN's activations for one 448-px image fit the CPU's caches and a batch's do not, so one at a
    # time is faster there (benchmarks/README.md, "Feature extraction and writing", has the figures).
    cpu_chunk: int | None = None
    weights_sha256: str | None = None  # of the weights file (None: no file)
    missing_head: list[str] = field(default_factory=list)  # head keys the weights file did not have
    tokens: int | None = None  # att rows when they are not a G×G grid (a ViT's patches and its CLS token)
    # a Hugging Face image processor: it turns each upright RGB image into the encoder's pixels itself
    # (its resize filter, centre crop and normalisation, as transformers runs the model); None: rdpp's
    # S×S resize and ``mean``/``std``
    processor: Any = None

    @property
    def regions(self) -> int:
        """Rows of ``att`` per image."""
        return self.tokens if self.tokens is not None else self.att_size ** 2


class ConvGrid(nn.Module):
    """A conv trunk followed by global average pooling (fc) and a G×G adaptive average pool (att)."""

    def __init__(self, trunk: nn.Module, att_size: int, final_relu: bool = False):
        super().__init__()
        self.trunk, self.att_size, self.final_relu = trunk, att_size, final_relu

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.trunk(x)
        if self.final_relu:
            y = F.relu(y)
        fc = y.mean(dim=(2, 3))
        att = F.adaptive_avg_pool2d(y, self.att_size).flatten(2).transpose(1, 2)
        return fc, att


class PixelStats(nn.Module):
    """Per cell of a G×G grid over an image in [0, 1] (D = 22):

    - mean RGB of each quarter of the cell (12), RGB standard deviation (3),
    - mean absolute grey-level derivative along x, y and the two diagonals (4),
    - mean saturation, max(RGB) − min(RGB) (1),
    - the cell's centre (x, y) in [0, 1] (2), so attention over cells still knows where a cell is.

    ``fc`` is the mean over cells. No parameters: nothing to train, nothing to download.
    """

    dim = 22

    def __init__(self, att_size: int):
        super().__init__()
        self.att_size = att_size
        g = att_size
        centers = (torch.arange(g, dtype=torch.float32) + 0.5) / g
        yy, xx = torch.meshgrid(centers, centers, indexing="ij")
        self.register_buffer("coords", torch.stack([xx.flatten(), yy.flatten()], dim=-1), persistent=False)

    def _cells(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, G*G, C), average per cell."""
        return F.adaptive_avg_pool2d(x, self.att_size).flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, g = x.shape[0], self.att_size
        quarters = F.adaptive_avg_pool2d(x, 2 * g)  # (B, 3, 2G, 2G)
        quarters = quarters.reshape(b, 3, g, 2, g, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, 12)
        mean = self._cells(x)
        std = (self._cells(x * x) - mean * mean).clamp_min(0).sqrt()
        grey = x.mean(dim=1, keepdim=True)
        pad = F.pad(grey, (1, 1, 1, 1), mode="replicate")
        dx = (pad[..., 1:-1, 2:] - pad[..., 1:-1, :-2]).abs()
        dy = (pad[..., 2:, 1:-1] - pad[..., :-2, 1:-1]).abs()
        d1 = (pad[..., 2:, 2:] - pad[..., :-2, :-2]).abs()
        d2 = (pad[..., 2:, :-2] - pad[..., :-2, 2:]).abs()
        grads = self._cells(torch.cat([dx, dy, d1, d2], dim=1))
        sat = self._cells(x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True))
        att = torch.cat([quarters, std, grads, sat, self.coords.expand(b, -1, -1)], dim=-1)
        return att.mean(dim=1), att


def build_backbone(
    name: str,
    *,
    att_size: int,
    image_size: int | None = None,
    weights: Path | str | None = None,
    pretrained: bool = True,
) -> Backbone:
    """The backbone ``name`` in eval mode on the CPU; raises RdppError for an unknown name or
    unusable weights (before anything is written)."""
    if att_size < 1:
        raise RdppError(f"--att-size {att_size} must be at least 1")
    if name == "pixstats":
        if weights is not None:
            raise RdppError("backbone pixstats has no weights; drop --weights")
        size = image_size or 64
        if size < att_size:
            raise RdppError(f"--image-size {size} is smaller than --att-size {att_size}")
        # tiny element-wise ops: with more threads, scheduling costs more than the work
        return Backbone("pixstats", PixelStats(att_size).eval(), PixelStats.dim, att_size, size, None, None, "none",
                        threads=1)
    if name.startswith(HF_PREFIX):
        if weights is not None:
            raise RdppError(f"backbone {name} reads its weights from its folder; drop --weights")
        return _hf_backbone(name[len(HF_PREFIX):], image_size)
    return _torchvision_backbone(name, att_size, image_size or 448, weights, pretrained)


class HFEncoder(nn.Module):
    """A Hugging Face vision encoder (frozen): ``att`` = its last hidden states (B, T, D), ``fc`` their mean."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        att = self.encoder(pixel_values=x).last_hidden_state
        return att.mean(dim=1), att


def _hf_backbone(folder: str, image_size: int | None) -> Backbone:
    """``hf:DIR``: the vision encoder of an image captioner's folder (``hf_folder.KINDS``) and its image
    processor, which prepares every image (rdpp's reader turns it upright and RGB first): the pixels
    the model sees in transformers, GIT's centre crop and BLIP's bicubic resize included."""
    from rdpp_cli.hf_folder import read_folder, require_transformers, vision_config, vision_encoder, weights_sha256

    model, _, kind = read_folder(folder, option="--backbone hf:")
    tf = require_transformers()
    try:
        proc = tf.AutoImageProcessor.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise RdppError(f"--backbone hf:{folder} has no image processor ({str(e).splitlines()[0]}); "
                        "save one in the folder (preprocessor_config.json)") from None
    crop = proc.crop_size if getattr(proc, "do_center_crop", False) and getattr(proc, "crop_size", None) else {}
    size = crop.get("height") or proc.size.get("height") or proc.size.get("shortest_edge")
    if image_size is not None and image_size != size:
        raise RdppError(f"--image-size {image_size}: the encoder of {folder} takes {size}×{size} images (its image "
                        "processor); leave --image-size out")
    module = HFEncoder(vision_encoder(model, kind).eval()).eval()
    with torch.no_grad():
        fc, att = module(torch.zeros(1, 3, size, size))
    patch = getattr(vision_config(kind, model.config), "patch_size", None)
    grid = size // patch if patch else int(att.shape[1] ** 0.5)
    folder = str(Path(folder).resolve())  # recorded as an absolute path: `rdpp caption` finds it from any folder
    return Backbone(HF_PREFIX + folder, module, int(fc.shape[1]), grid, size, None, None, str(folder),
                    weights_sha256=weights_sha256(folder), tokens=int(att.shape[1]), cpu_chunk=None, processor=proc)


def _torchvision_backbone(name: str, att_size: int, image_size: int, weights, pretrained: bool) -> Backbone:
    import torchvision

    known = set(torchvision.models.list_models(module=torchvision.models))
    if name not in known or name.startswith(_NOT_CONV):
        raise RdppError(f"unknown backbone '{name}'; use pixstats or a torchvision classification CNN "
                        "such as resnet101, resnet152, resnext101_32x8d, vgg16, densenet121, efficientnet_b0")
    source, state, file = "random init", None, None
    if weights is not None:
        file, source = Path(weights), str(weights)
    elif pretrained:
        file = _hub_cached_weights(name)
        if file is None:
            raise RdppError(
                f"ImageNet weights for {name} are not available offline (not in {_hub_dir()}); "
                "pass --weights PATH (a local state_dict) or --no-pretrained (random init)")
        source = "imagenet (hub cache)"
    if file is not None:
        state = _load_state(file, name)
    import warnings

    # a fixed seed: random-init features are reproducible, so a resumed run continues with the same model
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")  # googlenet/inception warn about their init scheme
        torch.manual_seed(0)
        model = torchvision.models.get_model(name, weights=None)
    missing_head: list[str] = []
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.lower().startswith("aux")]
        missing_head = [k for k in missing if _is_head_key(k)]
        missing = [k for k in missing if not _is_head_key(k)]  # the trunk must be complete
        if missing or unexpected:
            bad = (missing or unexpected)[:3]
            raise RdppError(f"weights {source} do not fit {name} ({'missing' if missing else 'unexpected'} "
                            f"keys such as {', '.join(bad)}); pass the state_dict of a torchvision {name}")
    trunk = nn.Sequential(*[m for n, m in model.named_children()
                            if n not in _HEAD_NAMES and not n.lower().startswith("aux")])
    module = ConvGrid(trunk, att_size, final_relu=name.startswith("densenet")).eval()
    try:
        with torch.no_grad():
            fc, att = module(torch.zeros(1, 3, image_size, image_size))
    except RuntimeError as e:
        raise RdppError(f"backbone {name} cannot run on {image_size}x{image_size} images "
                        f"({str(e).splitlines()[0]}); choose another --image-size") from None
    if fc.ndim != 2 or att.shape[1] != att_size * att_size:
        raise RdppError(f"backbone {name} has no convolutional feature map; choose a CNN such as resnet101")
    return Backbone(name, module, int(fc.shape[1]), att_size, image_size, IMAGENET_MEAN, IMAGENET_STD, source,
                    weights_sha256=file_sha256(file) if file is not None else None, missing_head=missing_head,
                    cpu_chunk=1)


def _is_head_key(key: str) -> bool:
    """A state_dict key of the pooling/classifier head, which the trunk drops anyway."""
    return key.split(".", 1)[0] in _HEAD_NAMES


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _hub_dir() -> str:
    return os.path.join(torch.hub.get_dir(), "checkpoints")


def _hub_cached_weights(name: str) -> Path | None:
    import torchvision

    try:
        url = torchvision.models.get_model_weights(name).DEFAULT.url
    except (ValueError, AttributeError, KeyError):
        return None
    p = Path(_hub_dir()) / os.path.basename(url)
    return p if p.is_file() else None


def _load_state(path: Path, name: str) -> dict:
    if not path.is_file():
        raise RdppError(f"weights file {path} does not exist; pass a local state_dict of a torchvision {name}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors of many kinds
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RdppError(f"weights file {path} could not be loaded ({first[:120]}); "
                        "pass a torch.save'd state_dict") from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise RdppError(f"weights file {path} holds no state_dict of tensors; pass a torch.save'd state_dict")
    return {k.removeprefix("module."): v for k, v in obj.items()}
