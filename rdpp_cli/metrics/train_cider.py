"""CIDEr-D as the training reward computes it: fixed training df, and the end token counted.

The published R-DPP code and self-critical.pytorch score a sampled caption *with* its end token:
``array_to_str`` writes a caption's ids up to and including its first 0 (the EOS), and the document
frequencies (``prepro_ngrams.py``) are counted over ``tokens + ['<eos>']`` of every training
reference, each n-gram once per image. So n-grams that end a caption ("on a table EOS") count, and a
caption that stops mid-phrase ("a man riding a EOS") scores low. A caption cut by the length limit
has no 0 in its row and is scored without an EOS; the same holds for a reference clipped to (or
exactly as long as) the label width.

Here the EOS is one more token id, ``vocab_size + 1`` (id 0 stays the padding that ends a row), so
the exact vectorised :class:`~rdpp_cli.metrics.cider.CiderD` scores it like any word; the data
artifact's ``cider_df.h5`` (schema 2) counts it (``data/prepro.py``). Evaluation (``rdpp score``,
coco-caption metrics against raw references) has no EOS and does not use this module.

The similarity kernel follows the published ``get_similarity_matrix``: for i <= j, ``S_ij`` is the
CIDEr-D of caption j scored against the single reference caption i, mirrored. (Self-CIDEr in
``rdpp_cli.metrics.self_cider`` keeps the diversity code's direction, caption i as the hypothesis.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.cider import CiderD, DocFreq

__all__ = ["NumpyScoring", "TrainCider", "doc_freq_with_eos", "eos_id", "with_eos", "word_counts"]


def eos_id(vocab_size: int) -> int:
    """The id of the end token in the training reward: one past the vocabulary's last word."""
    return int(vocab_size) + 1


def word_counts(tokens: np.ndarray) -> np.ndarray:
    """Words before the first 0 of each row of a (..., T) id array."""
    return (np.asarray(tokens) > 0).cumprod(-1).sum(-1)


def with_eos(tokens: Any, max_len: int, eos: int) -> np.ndarray:
    """(..., T) 0-padded ids -> (..., T + 1) int64 with ``eos`` right after every caption of fewer
    than ``max_len`` words (a caption that ended); a caption of ``max_len`` words or more was cut by
    the length limit and gets none."""
    tokens = np.asarray(tokens)
    n = word_counts(tokens)
    out = np.zeros((*tokens.shape[:-1], tokens.shape[-1] + 1), np.int64)
    pos = np.arange(tokens.shape[-1])
    out[..., :-1] = np.where(pos < n[..., None], tokens, 0)  # nothing after a caption's first 0
    ended = n < max_len
    idx = np.nonzero(ended)
    out[(*idx, n[ended])] = eos
    return out


class TrainCider:
    """The training reward's CIDEr-D (fixed df, end token counted; docs/metrics.md#cider-d) over token ids.

    ``df``: the training document frequencies (counted over ``tokens + [EOS]``); ``eos``: the EOS
    id they use; ``max_len``: the sampling length limit (captions of that many words have no EOS);
    ``ref_len``: the label width of the references (``captions.h5`` ``labels``), same rule.
    """

    def __init__(self, df: DocFreq, eos: int, max_len: int, ref_len: int | None = None) -> None:
        self.df = df
        self.eos = int(eos)
        self.max_len = int(max_len)
        self.ref_len = int(ref_len if ref_len is not None else max_len)
        self.cider = CiderD(df)

    @classmethod
    def for_data(cls, data, max_len: int | None = None, ref_len: int | None = None) -> "TrainCider":
        """The reward of a data artifact (a ``DataArtifact``); refuses one made before the EOS was
        counted (schema 1) with one line that says how to remake it. ``max_len`` and ``ref_len``
        default to the data's caption length (``captions.h5`` label width)."""
        schema = data.artifact.manifest.get("schema", 1)
        if schema < 2:
            raise RdppError(
                f"data artifact {data.path} was made by an older rdpp (schema {schema}): its cider_df.h5 "
                "does not count the end token that the training reward scores; remake it with "
                f"`rdpp prepro toy` or `rdpp prepro coco` ({_remake_hint(data)})")
        df = DocFreq.from_h5(data.cider_df_path)
        return cls(df, eos_id(data.vocab_size), max_len or data.seq_length, ref_len or data.seq_length)

    # -- EOS ---------------------------------------------------------------------------------
    def captions(self, tokens: Any) -> np.ndarray:
        """Sampled captions (..., T) with their EOS appended where they ended."""
        return with_eos(tokens, self.max_len, self.eos)

    def references(self, refs: list[np.ndarray]) -> list[np.ndarray]:
        """Encoded references (k, L) of each image with their EOS appended where they ended."""
        return [with_eos(r, self.ref_len, self.eos) for r in refs]

    # -- scores --------------------------------------------------------------------------------
    def score(self, hyps: Any, refs: list[np.ndarray], ref_index: Any = None) -> np.ndarray:
        """CIDEr-D (H,) of each hypothesis row (H, T) against ``refs[ref_index[h]]``."""
        return self.cider.score(self.captions(hyps), self.references(refs), ref_index)

    def score_each(self, hyps: Any, refs: list[np.ndarray], ref_index: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """CIDEr-D (H, k_max) of each hypothesis row against each reference of
        ``refs[ref_index[h]]`` alone (0 past the set's size), and the set sizes (H,)
        (``CiderD.score_each``)."""
        return self.cider.score_each(self.captions(hyps), self.references(refs), ref_index)

    def pairwise(self, samples: Any) -> np.ndarray:
        """The R-DPP kernel S (B, M, M) of the M samples of each image, published direction."""
        s = np.ascontiguousarray(self.captions(samples)[:, ::-1])
        return np.ascontiguousarray(self.cider.pairwise(s)[:, ::-1, ::-1])

    def score_and_pairwise(self, samples: Any, refs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """q (B, M) against the references and the kernel S (B, M, M), in one pass.

        ``CiderD.pairwise`` scores caption i against reference j for i <= j; the published kernel
        wants caption j against reference i. Reversing the order of the M captions turns one into
        the other: with ``c'_a = c_{M-1-a}``, the entry (a, b), a <= b, is caption M-1-a >= M-1-b
        scored against M-1-b, so flipping the result back gives ``S_ij = CIDEr-D(c_j | {c_i})``.
        """
        s = np.ascontiguousarray(self.captions(samples)[:, ::-1])
        q, K = self.cider.score_and_pairwise(s, self.references(refs))
        return np.ascontiguousarray(q[:, ::-1]), np.ascontiguousarray(K[:, ::-1, ::-1])


class NumpyScoring:
    """``TrainCider`` as a scoring backend of the RL reward (``training.finetune.reward_weights``),
    on the host: captions come in as tensors (or arrays), the numbers go out as float64 tensors.
    Its twin where the captions are is ``train_cider_torch.DeviceTrainCider`` (the same methods,
    the same numbers to ~1e-15):

    - ``pad(x, T)``: token rows (..., T') 0-padded to width T;
    - ``score(hyps, refs, ref_index)``: CIDEr-D (H,) of each row of ``hyps`` against its image's
      references (here ``refs``: a list of (k, L) id arrays, ``DataArtifact.references_ids``);
    - ``pairwise(samples)``: the R-DPP kernel (B, M, M), published direction;
    - ``score_and_pairwise(samples, refs)``: both from one pass;
    - ``self_cider(K)``: the self-CIDEr (B,) of each kernel;
    - ``sample_mean(q)``: the mean (B,) of each image's scores q (B, M).
    """

    def __init__(self, cider: TrainCider) -> None:
        self.cider = cider

    @staticmethod
    def _host(x: Any) -> np.ndarray:
        return x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)

    @staticmethod
    def pad(x: Any, T: int):
        import torch.nn.functional as F

        return x if x.shape[-1] >= T else F.pad(x, (0, T - x.shape[-1]))

    def score(self, hyps: Any, refs: list[np.ndarray], ref_index: Any = None):
        import torch

        idx = None if ref_index is None else self._host(ref_index)
        return torch.from_numpy(self.cider.score(self._host(hyps), refs, idx))

    def pairwise(self, samples: Any):
        import torch

        return torch.from_numpy(self.cider.pairwise(self._host(samples)))

    def score_and_pairwise(self, samples: Any, refs: list[np.ndarray]):
        import torch

        q, K = self.cider.score_and_pairwise(self._host(samples), refs)
        return torch.from_numpy(q), torch.from_numpy(K)

    def sample_mean(self, q: Any):
        import torch

        return torch.from_numpy(self._host(q).mean(1))

    def self_cider(self, K: Any):
        import torch

        from rdpp_cli.metrics.self_cider import self_cider_from_kernel

        return torch.from_numpy(np.asarray(self_cider_from_kernel(self._host(K)), np.float64))


def _remake_hint(data) -> str:
    cfg = data.artifact.config or {}
    src = cfg.get("karpathy_json")
    return f"from {src}" if src else "the same options as before"


def doc_freq_with_eos(refs_per_image: list[list[list[int]]], eos: int, words: list[str] | None = None) -> DocFreq:
    """Training document frequencies as ``prepro_ngrams.py`` counts them: for each image, the
    n-grams of ``ids + [EOS]`` of its references (UNK-mapped, not clipped), once per image."""
    sets = [[list(ids) + [eos] for ids in refs] for refs in refs_per_image]
    return DocFreq.from_references(sets, words=words)
