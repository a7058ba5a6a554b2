"""The log-probs and mask of a Hugging Face captioner's generated rows, for ``rdpp_cli.objective``.

``model.generate(pixel_values=..., do_sample=True, top_k=0, num_return_sequences=m)`` returns each
image's ``m`` samples consecutively (image-major, the order :class:`rdpp_cli.objective.Objective`
expects), each row starting with the decoder's start token. :func:`generated_logprobs` gives them
what the objective's loss needs: each generated token's teacher-forced log-probability (with the
graph, for the gradient) and the mask of the tokens the policy drew, the words plus the first end
token. The vision encoder runs once per image; its output is repeated to the ``m`` rows, so the
gradient still reaches the encoder. docs/api.md shows the ten lines of a loop.

Works with an encoder-decoder model whose forward takes ``encoder_outputs`` and
``decoder_input_ids`` (``VisionEncoderDecoderModel``: ViT, DeiT, Swin... encoders with a GPT-2, BERT
or RoBERTa-style decoder). The log-probs are computed in the mode the model is in: call it in the
mode the captions were drawn in (``model.eval()`` for both, or no dropout), so they are the
probabilities the captions were sampled with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rdpp_cli.errors import RdppError

__all__ = ["Generated", "generated_logprobs", "sampled_mask"]


@dataclass
class Generated:
    """Generated rows ready for :meth:`Objective.step`: ``ids`` (B*m, T) the generated tokens (the
    start token dropped), ``logprobs`` (B*m, T) each token's teacher-forced log-probability, with
    the graph, and ``mask`` (B*m, T) bool, True for the words and the first end token."""

    ids: Tensor
    logprobs: Tensor
    mask: Tensor


def sampled_mask(ids: Tensor, eos_token_id: int | Sequence[int]) -> Tensor:
    """True for each token up to and including the first end token of its row (the tokens a
    sampler drew; what follows is padding). A row without an end token (cut by ``max_new_tokens``)
    is all True."""
    is_end = torch.isin(ids, torch.as_tensor(_ids(eos_token_id), device=ids.device))
    seen = is_end.long().cumsum(-1)
    return (seen == 0) | ((seen == 1) & is_end)


def generated_logprobs(model: Any, pixel_values: Tensor, sequences: Any, *, m: int,
                       eos_token_id: int | Sequence[int] | None = None) -> Generated:
    """Teacher-forced log-probs and mask of ``generate``'s rows ``sequences`` (B*m, 1 + T), or its
    output with ``.sequences``, for the B images of ``pixel_values``, ``m`` rows per image
    (image-major). The encoder runs once on the B images. ``eos_token_id``: the end token (default:
    the model's generation config's)."""
    seqs = getattr(sequences, "sequences", sequences)
    if not isinstance(seqs, Tensor) or seqs.dim() != 2 or seqs.dtype.is_floating_point:
        raise RdppError(f"sequences: expected generate's (B*m, 1 + T) token ids, got "
                        f"{tuple(seqs.shape) if isinstance(seqs, Tensor) else type(seqs).__name__} "
                        "(generated_logprobs); pass model.generate(...) or its .sequences")
    B = pixel_values.shape[0]
    if seqs.shape[0] != B * int(m):
        raise RdppError(f"sequences hold {seqs.shape[0]} rows for {B} images and m={m}, expected {B * int(m)} "
                        "(generated_logprobs); generate with num_return_sequences=m on the same pixel_values")
    if seqs.shape[1] < 2:
        raise RdppError("sequences hold only the start token (generated_logprobs); generate with max_new_tokens >= 1")
    encoder = _encoder(model)
    hidden = encoder(pixel_values=pixel_values)[0]  # once per image
    encoded = _base_output(hidden.repeat_interleave(int(m), 0))
    logits = model(encoder_outputs=encoded, decoder_input_ids=seqs[:, :-1]).logits
    ids = seqs[:, 1:]
    logprobs = logits.log_softmax(-1).gather(-1, ids[..., None])[..., 0]
    return Generated(ids, logprobs, sampled_mask(ids, _end_token(model, eos_token_id)))


def _encoder(model: Any) -> Any:
    get = getattr(model, "get_encoder", None)
    encoder = get() if callable(get) else None
    if encoder is None or encoder is model:
        raise RdppError(f"{type(model).__name__} has no separate encoder (generated_logprobs): it takes an "
                        "encoder-decoder captioner such as VisionEncoderDecoderModel")
    return encoder


def _base_output(hidden: Tensor) -> Any:
    from transformers.modeling_outputs import BaseModelOutput

    return BaseModelOutput(last_hidden_state=hidden)


def _end_token(model: Any, given: int | Sequence[int] | None) -> int | Sequence[int]:
    if given is not None:
        return given
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None),
                getattr(getattr(model, "config", None), "decoder", None)):
        eos = getattr(cfg, "eos_token_id", None)
        if eos is not None:
            return eos
    raise RdppError(f"{type(model).__name__} names no end token (generated_logprobs); pass eos_token_id=")


def _ids(x: int | Sequence[int]) -> list[int]:
    return [int(x)] if isinstance(x, int) or (isinstance(x, Tensor) and x.dim() == 0) else [int(i) for i in x]
