"""R-DPP, SCST and the mean baseline for any captioner: the objective of ``rdpp finetune`` as a library.

A training loop of your own (any model, any tokenizer) builds an :class:`Objective` once from the
training references, then each step hands it the ``m`` captions it sampled per image and their
log-probabilities and gets back the per-caption weights and the policy-gradient loss::

    from rdpp_cli.objective import Objective

    objective = Objective.from_references({"img1": ["A dog runs.", ...], ...}, reward="dpp", m=5)
    out = objective.step(image_ids, samples, token_logp, mask, decode=tokenizer.decode)
    out.loss.backward()

The numbers are those of ``rdpp finetune`` for the same captions (docs/api.md): the training reward's
CIDEr-D (``rdpp_cli.metrics.train_cider``: fixed document frequencies counted over every training
reference plus its end token, the end token of every caption that ended scored), the reward's weight
function of ``rdpp_cli.training.reward_table`` and ``rdpp_cli.training.rewards.pg_loss``'s
normalisation (per sample slot for R-DPP, over all sampled tokens for SCST). CIDEr-D is computed on
words whatever the model's tokenizer: captions given as the model's token ids are turned into text by
its ``decode``, then tokenized by rdpp's rule (:func:`tokenize`) and mapped to the reference
vocabulary, an unknown word to ``UNK``.

Needs torch (the weights and the loss are tensors): the trainer extra, ``pip install 'rdpp[train]'``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import torch
    from torch import Tensor
except ImportError:  # the core install: say what to install, in one line
    raise ImportError("rdpp_cli.objective needs torch (the trainer extra); install it with "
                      "pip install 'rdpp[train]'") from None

from rdpp_cli.data import vocab as V
from rdpp_cli.data.karpathy import tokenize as _karpathy_tokenize
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import NumpyScoring, TrainCider, doc_freq_with_eos, eos_id
from rdpp_cli.objective_hf import Generated, generated_logprobs
from rdpp_cli.objective_trl import trl_reward
from rdpp_cli.training.finetune import reward_weights
from rdpp_cli.training.reward_table import REWARDS, Reward
from rdpp_cli.training.rewards import pg_loss

__all__ = ["Objective", "StepResult", "Weights", "REWARD_NAMES", "tokenize", "generated_logprobs", "Generated",
           "trl_reward"]

# the rewards of `rdpp finetune --reward` this API computes: every one of the table but those that add the
# model's XE loss on the references (xe-cider), which only the caller's model can compute
REWARD_NAMES = tuple(name for name, r in REWARDS.items() if not r.xe_mix)
BASELINES = ("none", "mean")
_NO_LIMIT = 2**31 - 1  # a length limit no caption reaches: every caption is scored as one that ended

Decode = Callable[[list[int]], str]


def tokenize(text: str) -> list[str]:
    """Words of a caption by rdpp's rule (``rdpp prepro``'s, for a sentence given as text): lower
    case, letters and digits of any script only, split at everything else ("A dog's toy." -> a, dog,
    s, toy; "Ein Mädchen." -> ein, mädchen). Segment a script written without spaces into words first."""
    return _karpathy_tokenize(text)


@dataclass
class StepResult:
    """One step's objective: ``loss`` (a scalar with the graph of the log-probs given), ``weights``
    (B, m) float32 (what multiplies each caption's log-probability), ``scores`` (B, m) float64 (each
    sample's CIDEr-D), ``logs`` (the numbers ``rdpp finetune`` logs: sample_cider, reward,
    greedy_cider for SCST, self_cider for m > 1) and ``captions`` (the B*m texts scored, image-major)."""

    loss: Tensor
    weights: Tensor
    scores: Tensor
    logs: dict[str, float]
    captions: list[str] = field(default_factory=list)


@dataclass
class Weights:
    """:meth:`Objective.weights`: a step's weights without the loss (fields as in :class:`StepResult`)."""

    weights: Tensor  # (B, m) float32
    scores: Tensor  # (B, m) float64: the samples' CIDEr-D
    logs: dict[str, float]
    captions: list[str]


@dataclass
class Objective:
    """The training reward and the objective of one ``rdpp finetune --reward`` (dpp, scst or
    scst-mean) over plain references. Build it with :meth:`from_references`."""

    reward: str
    m: int
    baseline: str
    cider: TrainCider
    words: list[str]  # the reference vocabulary: word ``words[i]`` has id i + 1; it ends with UNK
    references: dict[Hashable, np.ndarray]  # each image's encoded references (k, L), 0-padded
    _w2i: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.reward not in REWARD_NAMES:
            raise RdppError(f"reward {self.reward!r} is not one this API computes (Objective); use one of "
                            f"{', '.join(REWARD_NAMES)} (xe-cider needs the model's XE loss: add it yourself)")
        _check_baseline(self.reward, self.baseline)
        if int(self.m) < self.spec.min_m:
            raise RdppError(f"m={self.m} is too few samples per image for reward {self.reward} (Objective): "
                            f"{self.spec.min_m_why.replace('--m ', 'm=')}")
        self._w2i = V.word_to_id(self.words)

    @property
    def spec(self) -> Reward:
        """The reward's line of ``rdpp_cli.training.reward_table``: whether it needs the greedy
        captions (``greedy``), the samples' kernel (``kernel``), its loss normalisation (``per_slot``)."""
        return REWARDS[self.reward]

    @classmethod
    def from_references(cls, references: Mapping[Hashable, Sequence[str]], *, reward: str = "dpp", m: int = 5,
                        baseline: str = "none", max_len: int | None = None, ref_len: int | None = None,
                        word_count_threshold: int = 0, words: Sequence[str] | None = None) -> "Objective":
        """The objective over the training references: ``{image id: [caption text, ...]}``.

        Each caption is tokenized by :func:`tokenize`. The vocabulary is ``words`` if given (``UNK``
        is added when missing), else the words seen more than ``word_count_threshold`` times, as
        ``rdpp prepro`` builds it (0: every word of the references). The document frequencies count,
        for each image, the n-grams of each reference (unknown words as UNK, not clipped) plus its
        end token, once per image. ``max_len``: the sampling limit in words; a caption of that many
        words or more was cut and is scored without the end token (None: every caption ended).
        ``ref_len``: references are clipped to that many words and those as long as it scored
        without the end token (rdpp's ``captions.h5`` labels; None: no clipping). ``rdpp finetune``
        on a data artifact made with ``--max-length L`` is ``max_len=L, ref_len=L``."""
        _check_limits(max_len=max_len, ref_len=ref_len)
        tokens = {key: [tokenize(c) for c in _caption_list(key, caps)] for key, caps in references.items()}
        if not tokens:
            raise RdppError("no references given (Objective.from_references); pass {image id: [caption, ...]}")
        empty = next((key for key, caps in tokens.items() if not caps or not all(caps)), None)
        if empty is not None:
            raise RdppError(f"image {empty!r} has {'a reference without a word' if tokens[empty] else 'no references'} "
                            "(Objective.from_references); remove it or give it captions with words")
        words_given = words is not None
        if words is None:
            words = V.build_vocab((c for caps in tokens.values() for c in caps), int(word_count_threshold))
        words = list(words) + ([] if V.UNK in words else [V.UNK])
        w2i, unk = V.word_to_id(words), words.index(V.UNK) + 1
        ids = {key: [[w2i.get(t, unk) for t in c] for c in caps] for key, caps in tokens.items()}
        _check_unk(ids, unk, "words=" if words_given else f"word_count_threshold={word_count_threshold}")
        eos = eos_id(len(words))
        df = doc_freq_with_eos(list(ids.values()), eos, words=words)
        cider = TrainCider(df, eos, max_len or _NO_LIMIT, ref_len or _NO_LIMIT)
        refs = {key: _pad([c[:ref_len] if ref_len else c for c in caps]) for key, caps in ids.items()}
        return cls(reward=reward, m=int(m), baseline=baseline, cider=cider, words=words, references=refs)

    # -- captions -> word ids ---------------------------------------------------------------------
    def encode(self, captions: Sequence[str]) -> np.ndarray:
        """Caption texts -> (C, T) int64 ids in the reference vocabulary (tokenized by rdpp's rule,
        unknown words as UNK), 0-padded."""
        unk = self._w2i[V.UNK]
        return _pad([[self._w2i.get(t, unk) for t in tokenize(c)] for c in captions])

    def texts(self, captions: Any, rows: int, decode: Decode | None = None, what: str = "samples") -> list[str]:
        """``rows`` caption texts from strings (a flat or nested list) or token ids (a tensor, an array or
        nested lists of ints) turned into text by ``decode``."""
        flat = _flatten(captions, what)
        if len(flat) != rows:
            raise RdppError(f"{what}: got {len(flat)} captions, expected {rows} (Objective); pass m={self.m} "
                            "captions per image, image-major")
        if all(isinstance(c, str) for c in flat):
            return flat
        if decode is None:
            raise RdppError(f"{what} are token ids but no decode function was given (Objective); pass "
                            "decode=tokenizer.decode (ids -> text) or the captions as strings")
        return [_decoded_text(decode, list(c)) for c in flat]

    # -- one step -----------------------------------------------------------------------------------
    def refs_for(self, image_ids: Sequence[Hashable]) -> list[np.ndarray]:
        """The encoded references (k, L) of each image of ``image_ids``."""
        out = []
        for key in image_ids:
            key = key.item() if hasattr(key, "item") else key
            if key not in self.references:
                raise RdppError(f"image id {key!r} has no references (Objective); pass the ids given to "
                                "from_references")
            out.append(self.references[key])
        return out

    def weights(self, image_ids: Sequence[Hashable], samples: Any, *, decode: Decode | None = None,
                greedy: Any = None) -> Weights:
        """The per-caption weights (B, m) of the step's samples (``m`` per image, image-major) for the
        images ``image_ids``; ``greedy``: the B greedy captions SCST compares with (required by
        reward scst). Samples and greedy captions are texts, or token ids with ``decode``."""
        B, m = len(image_ids), self.m
        refs = self.refs_for(image_ids)
        texts = self.texts(samples, B * m, decode)
        if self.spec.greedy and greedy is None:
            raise RdppError(f"reward {self.reward} compares each sample with its image's greedy caption "
                            "(Objective); pass greedy= (B captions)")
        greedy_texts = self.texts(greedy, B, decode, "greedy") if self.spec.greedy else None
        scorer = _KeepScores(self.cider)  # finetune's reward, on its host backend: one scoring path
        samples_ids = torch.from_numpy(self.encode(texts)).view(B, m, -1)
        greedy_ids = None if greedy_texts is None else torch.from_numpy(self.encode(greedy_texts))
        w, logs = reward_weights(scorer, self.spec.weight_fn(), self.spec.kernel or m > 1, self.baseline,
                                 samples_ids, greedy_ids, refs)
        return Weights(w, scorer.sample_scores(B, m), {k: float(v) for k, v in logs.items()}, texts)

    def loss(self, weights: Tensor, logprobs: Tensor, mask: Tensor | None = None, *,
             lengths: Tensor | Sequence[int] | None = None) -> Tensor:
        """The policy-gradient loss ``-Σ w·log p`` of ``rdpp finetune``, normalised per sample slot
        (R-DPP) or over all sampled tokens (SCST, mean baseline).

        Either per-token ``logprobs`` (B, m, T) or (B*m, T) with ``mask`` of the same shape (1 for
        every token the policy drew, its end token included; 0 for padding and for an end token
        forced at the length limit), or per-caption sums ``logprobs`` (B, m) or (B*m,) with
        ``lengths``, the number of tokens each sum holds. ``weights`` (B, m) carry no gradient."""
        w = _loss_weights(weights, logprobs, self.m)
        _refuse_vocabulary_logprobs(logprobs, weights)
        per_caption = tuple(weights.shape)  # (B, m)
        N, groups = w.shape[0], self.m if self.spec.per_slot else 1
        if mask is not None:
            mask = _token_mask(mask, logprobs, per_caption)
            return pg_loss(logprobs.reshape(N, -1), mask.reshape(N, -1).to(logprobs.device), w, groups=groups)
        if lengths is None:
            raise RdppError("logprobs without mask are per-caption sums and need lengths= (tokens in each sum) "
                            "for rdpp's normalisation (Objective.loss); pass lengths or the per-token mask")
        if tuple(logprobs.shape) not in (per_caption, (N,)):
            raise RdppError(f"logprobs {tuple(logprobs.shape)}: expected one sum per caption, {per_caption} or ({N},), "
                            "or a mask= for per-token log-probs (Objective.loss)")
        n = _caption_lengths(lengths, N, logprobs)
        tokens = n.sum() if groups == 1 else n.view(-1, groups).sum(0)
        return pg_loss(logprobs.reshape(N, 1), torch.ones(N, 1, dtype=logprobs.dtype, device=logprobs.device), w,
                       groups=groups, tokens=tokens)

    def step(self, image_ids: Sequence[Hashable], samples: Any, logprobs: Tensor, mask: Tensor | None = None, *,
             lengths: Tensor | Sequence[int] | None = None, decode: Decode | None = None,
             greedy: Any = None) -> StepResult:
        """:meth:`weights` then :meth:`loss`: one training step's objective."""
        w = self.weights(image_ids, samples, decode=decode, greedy=greedy)
        loss = self.loss(w.weights, logprobs, mask, lengths=lengths)
        return StepResult(loss, w.weights, w.scores, w.logs, w.captions)


# -- helpers --------------------------------------------------------------------------------------

class _KeepScores(NumpyScoring):
    """``NumpyScoring`` that keeps the samples' CIDEr-D it computed (``reward_weights`` returns the
    weights; :class:`Weights` also reports the scores)."""

    _scores: Tensor | None = None

    def score(self, hyps: Any, refs: list[np.ndarray], ref_index: Any = None) -> Tensor:
        self._scores = super().score(hyps, refs, ref_index)
        return self._scores

    def score_and_pairwise(self, samples: Any, refs: list[np.ndarray]) -> tuple[Tensor, Tensor]:
        q, K = super().score_and_pairwise(samples, refs)
        self._scores = q.reshape(-1)
        return q, K

    def sample_scores(self, B: int, m: int) -> Tensor:
        """q (B, m): the first B*m rows scored are the samples (the greedy captions follow)."""
        assert self._scores is not None
        return self._scores[:B * m].reshape(B, m)


def _caption_list(key: Hashable, caps: Any) -> list[str]:
    if isinstance(caps, str) or not all(isinstance(c, str) for c in caps):
        raise RdppError(f"references of image {key!r} are not a list of caption strings "
                        "(Objective.from_references); pass {image id: [caption, ...]}")
    return list(caps)


def _flatten(captions: Any, what: str) -> list:
    """Captions image-major as one list: strings, or id sequences (lists of ints)."""
    if captions is None:
        raise RdppError(f"no {what} given (Objective); pass the captions (texts, or ids with decode=), image-major")
    if hasattr(captions, "detach"):  # a torch tensor
        captions = captions.detach().cpu().numpy()
    if isinstance(captions, np.ndarray) and captions.dtype.kind == "O":  # e.g. an array of strings as objects
        captions = captions.tolist()
    if isinstance(captions, np.ndarray):
        if captions.dtype.kind in "US":
            return [str(c) for c in captions.reshape(-1)]
        if captions.dtype.kind not in "iu":
            raise RdppError(f"{what}: token ids must be integers, got {captions.dtype} (Objective); pass ids "
                            "(B, m, T) or texts")
        return [[int(t) for t in row] for row in captions.reshape(-1, captions.shape[-1])] if captions.ndim else []
    if isinstance(captions, str):
        return [captions]
    items = list(captions)
    if not items or all(_is_id(c) for c in items):  # one caption's ids (ints, or 0-d integer tensors)
        return [[int(c) for c in items]]
    return [c for item in items for c in _flatten(item, what)]


def _is_id(c: Any) -> bool:
    """One token id: an int, or a 0-d integer array or tensor (what iterating over a 1-d tensor gives)."""
    if isinstance(c, (bool, np.bool_)):
        return False
    if isinstance(c, (int, np.integer)):
        return True
    if isinstance(c, Tensor):
        return c.dim() == 0 and not c.is_floating_point() and not c.is_complex() and c.dtype != torch.bool
    return isinstance(c, np.ndarray) and c.ndim == 0 and c.dtype.kind in "iu"


def _pad(rows: Sequence[Sequence[int]]) -> np.ndarray:
    out = np.zeros((len(rows), max([1, *map(len, rows)])), np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


# -- argument checks: each bad argument is one RdppError line (what, where, what to pass) ---------

def _refuse_vocabulary_logprobs(logprobs: Any, weights: Any) -> None:
    """Refuse log-probs shaped (B, m, T, V) or (B*m, T, V): one entry per vocabulary word, not per
    sampled token. ``weights`` (B, m) tell the per-token form (B, m, T) from (B*m, T, V)."""
    shape = tuple(logprobs.shape)
    rows = weights.numel()
    full = len(shape) == 4 or (len(shape) == 3 and shape[0] == rows and shape[:2] != tuple(weights.shape))
    if full:
        raise RdppError(f"logprobs {shape} look like the full log-softmax over the vocabulary (Objective.loss); "
                        "pass the sampled tokens' log-probs: log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]")


def _decoded_text(decode: Callable[[list[int]], Any], ids: list[int]) -> str:
    """``decode(ids)``, refused unless it is a string."""
    text = decode(ids)
    if isinstance(text, str):
        return text
    kind = type(text).__name__
    hint = ("a list (batch_decode or convert_ids_to_tokens?)" if isinstance(text, (list, tuple)) else f"a {kind}")
    raise RdppError(f"decode returned {hint}, not a string, for the ids {ids[:8]}{'...' if len(ids) > 8 else ''} "
                    "(Objective); pass decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True)")



def _check_baseline(reward: str, baseline: str) -> None:
    if baseline not in BASELINES:
        raise RdppError(f"baseline {baseline!r} is not one of {', '.join(BASELINES)} (Objective); "
                        "pass baseline='none' or 'mean'")
    if baseline != "none" and "baseline" not in REWARDS[reward].settings:
        with_baseline = [r.name for r in REWARDS.values() if "baseline" in r.settings]
        raise RdppError(f"baseline={baseline!r} applies to reward {' or '.join(with_baseline)} only (Objective); "
                        "pass baseline='none', or reward='scst-mean' for SCST with a mean baseline")


def _check_limits(**limits: Any) -> None:
    """``max_len``, ``ref_len``: None (no limit) or a number of words >= 1."""
    for name, value in limits.items():
        if value is None:
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
            raise RdppError(f"{name}={value!r} is not a length limit (Objective.from_references); pass a number "
                            "of words (1 or more), or None for no limit")


def _check_unk(ids: Mapping[Hashable, list[list[int]]], unk: int, vocabulary: str) -> None:
    """The references' share of UNK: none of their words known is refused (every caption would score
    alike); above ``V.HIGH_UNK`` a warning, as ``rdpp prepro`` gives."""
    flat = [t for caps in ids.values() for c in caps for t in c]
    share = sum(t == unk for t in flat) / len(flat)
    if share == 1.0:
        raise RdppError(f"every word of the references is UNK under {vocabulary} (Objective.from_references); "
                        "pass the references' own vocabulary (words=None) or a lower word_count_threshold")
    if share > V.HIGH_UNK:
        warnings.warn(f"{share:.1%} of the reference words are UNK under {vocabulary} (Objective.from_references); "
                      "CIDEr-D cannot tell those words apart: a lower word_count_threshold or a wider words= keeps "
                      "more", stacklevel=3)


def _loss_weights(weights: Any, logprobs: Any, m: int) -> Tensor:
    """``weights`` (B, m) as a flat (B*m,) tensor on the log-probs' device, after checking both are tensors."""
    if isinstance(weights, (Weights, StepResult)):
        raise RdppError(f"loss() takes the weights tensor, got a {type(weights).__name__} object (Objective.loss); "
                        "pass its .weights")
    for name, value in (("weights", weights), ("logprobs", logprobs)):
        if not isinstance(value, Tensor):
            raise RdppError(f"{name} is a {type(value).__name__}, not a torch tensor (Objective.loss); pass the "
                            f"{'weights tensor (B, m)' if name == 'weights' else 'log-probs as a tensor with their graph'}")
    if weights.dim() != 2 or weights.shape[1] != m:
        raise RdppError(f"weights {tuple(weights.shape)}: expected (B, {m}) (Objective.loss); pass the weights "
                        "that weights() or step() returned")
    return weights.detach().reshape(-1).to(logprobs.device)


def _token_mask(mask: Any, logprobs: Tensor, per_caption: tuple[int, int]) -> Tensor:
    """The per-token mask as a tensor, after checking that ``logprobs`` is (B, m, T) or (B*m, T) and the
    mask has its shape."""
    B, m = per_caption
    if logprobs.dim() not in (2, 3) or (logprobs.dim() == 3 and tuple(logprobs.shape[:2]) != (B, m)) \
            or (logprobs.dim() == 2 and logprobs.shape[0] != B * m):
        raise RdppError(f"logprobs {tuple(logprobs.shape)}: expected (B, m, T) = ({B}, {m}, T) or (B*m, T) = ({B * m}, T) "
                        "per-token log-probs "
                        "of the captions weighted (Objective.loss); pass one row per caption, image-major")
    if not isinstance(mask, Tensor):
        try:
            mask = torch.as_tensor(np.asarray(mask))
        except (TypeError, ValueError, RuntimeError):
            raise RdppError(f"mask is a {type(mask).__name__} that is not an array of 0/1 (Objective.loss); pass "
                            "a tensor or array shaped as logprobs") from None
    if mask.shape != logprobs.shape:
        raise RdppError(f"mask {tuple(mask.shape)} and logprobs {tuple(logprobs.shape)} differ in shape "
                        "(Objective.loss); pass one mask entry per token")
    return mask


def _caption_lengths(lengths: Any, N: int, logprobs: Tensor) -> Tensor:
    """``lengths``: N token counts, each 1 or more (every caption holds at least its end token or a word)."""
    try:
        n = torch.as_tensor(np.asarray(lengths.detach().cpu() if isinstance(lengths, Tensor) else lengths),
                            dtype=logprobs.dtype)
    except (TypeError, ValueError, RuntimeError):
        raise RdppError(f"lengths is a {type(lengths).__name__}, not numbers (Objective.loss); pass the tokens "
                        f"in each of the {N} sums") from None
    if n.numel() != N:
        raise RdppError(f"lengths holds {n.numel()} counts for {N} captions (Objective.loss); pass the tokens in "
                        "each caption's sum, image-major")
    if not bool(torch.isfinite(n).all()) or bool((n < 1).any()):
        raise RdppError(f"lengths holds {float(n.min()):g} (Objective.loss); each caption's sum holds 1 token or "
                        "more: pass the tokens in each sum")
    return n.reshape(N).to(logprobs.device)
