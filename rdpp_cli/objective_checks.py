"""Two mistakes of a training loop handing its captions to ``rdpp_cli.objective``, named in one line
each: the full log-softmax over the vocabulary where the sampled tokens' log-probs are expected, and
a ``decode`` that returns something other than a string (a tokenizer's ``batch_decode`` or
``convert_ids_to_tokens`` returns a list)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rdpp_cli.errors import RdppError

__all__ = ["refuse_vocabulary_logprobs", "decoded_text"]


def refuse_vocabulary_logprobs(logprobs: Any, weights: Any) -> None:
    """Refuse log-probs shaped (B, m, T, V) or (B*m, T, V): one entry per vocabulary word, not per
    sampled token. ``weights`` (B, m) tell the per-token form (B, m, T) from (B*m, T, V)."""
    shape = tuple(logprobs.shape)
    rows = weights.numel()
    full = len(shape) == 4 or (len(shape) == 3 and shape[0] == rows and shape[:2] != tuple(weights.shape))
    if full:
        raise RdppError(f"logprobs {shape} look like the full log-softmax over the vocabulary (Objective.loss); "
                        "pass the sampled tokens' log-probs: log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]")


def decoded_text(decode: Callable[[list[int]], Any], ids: list[int]) -> str:
    """``decode(ids)``, refused unless it is a string."""
    text = decode(ids)
    if isinstance(text, str):
        return text
    kind = type(text).__name__
    hint = ("a list (batch_decode or convert_ids_to_tokens?)" if isinstance(text, (list, tuple)) else f"a {kind}")
    raise RdppError(f"decode returned {hint}, not a string, for the ids {ids[:8]}{'...' if len(ids) > 8 else ''} "
                    "(Objective); pass decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True)")
