"""Validation after every epoch: the images it uses and their greedy captions' CIDEr-D.

``validation_images`` picks the val split (or its first ``--val-images``); ``greedy_cider`` decodes
them greedily and sums the captions' CIDEr-D under the data artifact's training df (plus any metric a
stage adds, e.g. finetune's sampled captions' CIDEr-D and self-CIDEr), as sums so that DDP processes
can add theirs up (``merge_sums``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.errors import RdppError
from rdpp_cli.training.distributed import unwrap
from rdpp_cli.training.fast import EAGER, Steps


def validation_images(data: DataArtifact, val_images: int | None) -> np.ndarray:
    """Rows of the images validated after each epoch: the val split, or its first ``val_images``."""
    if val_images == 0:
        return np.zeros(0, dtype=np.int64)
    if not (data.split == "val").any():
        raise RdppError(f"data artifact {data.path} has no val images to validate on; "
                        "pass --val-images 0 to train without validation")
    idx = data.split_indices("val")
    return idx if val_images is None else idx[:val_images]


def greedy_cider(model: nn.Module, data: DataArtifact, images: np.ndarray, *, batch_size: int = 100,
                 device: torch.device | str = "cpu", cider=None,
                 epoch_metrics_fn=None, steps: Steps = EAGER) -> dict[str, float]:
    """Sums over ``images`` of the greedy caption's CIDEr-D (the training reward's: training df, end
    token counted) and of any extra metric.

    Returns ``{"val_cider": sum, ..., "_n": number of images}`` (sums, so that processes can add
    theirs up). The model is put in eval mode and back. ``steps`` (the run's ``training.fast.Steps``)
    decode and score: eager, in numpy on the host; the fast path, the greedy pass as one compiled
    function and its CIDEr-D on the device against the data artifact's reference table: the same
    captions and, to ~1e-15, the same sum.
    """
    from rdpp_cli.decoding.decode import DecodeConfig
    from rdpp_cli.metrics.train_cider import TrainCider
    from rdpp_cli.models.bridge import bridge_for

    cider = cider or TrainCider.for_data(data)
    m = unwrap(model)
    bridge = bridge_for(m, data.words, data.seq_length)  # decoded in the model's ids, scored on the data's words
    greedy = DecodeConfig(method="greedy", max_len=bridge.max_len, unk_id=bridge.unk_id)  # no UNK, as `rdpp sample`
    was_training = m.training
    m.eval()
    sums: dict[str, float] = {"val_cider": 0.0, "_n": 0.0}
    try:
        if len(images):
            batches = CaptionBatches(data, images=images, batch_size=batch_size, shuffle=False, seq_per_img=0)
            for batch in batches.epoch(0):
                batch = batch.to(device)
                data.check_finite(batch.index, batch.fc, batch.att)  # no score from a corrupt input
                with torch.no_grad():
                    sums["val_cider"] += float(_greedy_scores(m, data, batch, greedy, cider, bridge, steps).sum())
                    if epoch_metrics_fn is not None:
                        for k, v in epoch_metrics_fn(m, batch).items():
                            v = v.detach().cpu().numpy() if isinstance(v, Tensor) else np.asarray(v)
                            sums[k] = sums.get(k, 0.0) + float(v.sum())
                sums["_n"] += batch.size
    finally:
        m.train(was_training)
    return sums


def _greedy_scores(model: nn.Module, data: DataArtifact, batch, cfg, cider, bridge, steps: Steps) -> np.ndarray:
    """The greedy captions' CIDEr-D (B,) of one batch: decoded by ``steps``, read as the data's words
    (``bridge``: the model's ids -> the data's), scored by ``steps``' backend (``Steps.scoring``)."""
    from rdpp_cli.precision import full_precision

    tokens = steps.decode(model, batch.att, cfg, batch.att_mask, batch.fc).tokens[:, 0]
    scorer, refs = steps.scoring(cider, data, batch.index, tokens.device)
    with full_precision(tokens.device):  # the reward never runs under autocast
        scores = steps.compiled(_score, row_wise=True)(scorer, steps.words(bridge, tokens), refs)
    return scores.cpu().numpy()


def _score(scorer, tokens: Tensor, refs) -> Tensor:
    return scorer.score(tokens, refs)


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            total[k] = total.get(k, 0.0) + v
    return total
