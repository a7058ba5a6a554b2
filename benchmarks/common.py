"""What the benchmarks here share: COCO's shapes, the paper-size model and synthetic batches.

Shapes (the paper preset on COCO): Att2in 512/512/512 with dropout 0.5, a vocabulary of 9,487 words
(9,488 logits, 0 = EOS), 14 × 14 = 196 att regions of 2,048 features (CNN features: ≥ 0), captions
of at most 16 words, 5 per image, batches of 50 images. Every input is drawn from a seeded generator,
so two sides of a benchmark (and two runs of it) get the same numbers.
"""

from __future__ import annotations

import numpy as np
import torch

from rdpp_cli.data.loader import Batch
from rdpp_cli.models.att2in import Att2in, config_from_preset

VOCAB, REGIONS, ATT_DIM, SEQ_LEN, SEQ_PER_IMG, BATCH = 9487, 196, 2048, 16, 5, 50
REFS = 5  # references per image
ROW_BYTES = (REGIONS * ATT_DIM + ATT_DIM) * 2  # one image's att + fc features in float16 (0.81 MB)


def parse_words(s: str) -> tuple[int, int]:
    """``--words N`` or ``MIN-MAX`` -> (MIN, MAX), within 1..SEQ_LEN."""
    lo, _, hi = s.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi <= SEQ_LEN:
        raise SystemExit(f"--words {s}: give N or MIN-MAX with 1 ≤ MIN ≤ MAX ≤ {SEQ_LEN}")
    return lo, hi


def eos_probability(words: float, max_len: int = SEQ_LEN) -> float:
    """The per-step EOS probability p that gives captions of ``words`` words on average when the
    length limit cuts them at ``max_len``: E[words] = Σ_{k=1..L} (1 − p)^k."""
    if words >= max_len - 1e-3:
        return 0.0
    lo, hi = 1e-9, 1.0
    for _ in range(100):
        p = (lo + hi) / 2
        mean = (1 - p) * (1 - (1 - p) ** max_len) / p
        lo, hi = (p, hi) if mean > words else (lo, p)
    return (lo + hi) / 2


def paper_model(seed: int = 0, words: float | None = None, device="cpu") -> Att2in:
    """A random Att2in of the paper preset at COCO's shapes (``torch.manual_seed(seed)`` first).
    ``words``: the EOS logit's bias set so that sampled captions have that many words on average
    (the other logits are ≈ 0: P(EOS) = e^b / (e^b + V))."""
    torch.manual_seed(seed)
    model = Att2in(config_from_preset("paper", vocab_size=VOCAB, att_feat_size=ATT_DIM, seq_length=SEQ_LEN))
    if words is not None:
        p = eos_probability(words)
        with torch.no_grad():
            model.logit.bias[0] = float(np.log(p * VOCAB / (1 - p))) if p > 0 else -30.0
    return model.to(device)


def features(images: int, generator: torch.Generator) -> torch.Tensor:
    """(images, REGIONS, ATT_DIM) att features: Gaussian, cut at 0 as a CNN's are."""
    return torch.randn(images, REGIONS, ATT_DIM, generator=generator).relu_()


def make_batch(images: int, words: tuple[int, int] | None = None, device="cpu", seed: int = 0) -> Batch:
    """A training batch of ``images`` images: features, and with ``words`` (MIN, MAX) SEQ_PER_IMG
    random captions per image of MIN..MAX words (uniform); without, one empty caption per image
    (the RL steps sample their own)."""
    g = torch.Generator().manual_seed(seed)
    att = features(images, g)
    if words is None:
        labels = torch.zeros(images, 1, SEQ_LEN, dtype=torch.long)
    else:
        labels = torch.randint(1, VOCAB + 1, (images, SEQ_PER_IMG, SEQ_LEN), generator=g)
        n = torch.randint(words[0], words[1] + 1, (images, SEQ_PER_IMG, 1), generator=g)
        labels = labels * (torch.arange(SEQ_LEN) < n)
    return Batch(index=np.arange(images), fc=att.mean(1), att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=images).to(device)


def zipf_p(exponent: float = 1.1) -> np.ndarray:
    """Word frequencies over the vocabulary ∝ 1 / rank^exponent (word i + 1 has rank i + 1)."""
    p = 1.0 / np.arange(1, VOCAB + 1) ** exponent
    return p / p.sum()


def make_refs(rng: np.random.Generator, n_images: int) -> list[np.ndarray]:
    """REFS references per image, (REFS, SEQ_LEN) word ids each: 8–12 Zipf-distributed words, 0-padded."""
    p = zipf_p()
    out = []
    for _ in range(n_images):
        r = np.zeros((REFS, SEQ_LEN), np.int64)
        for k in range(REFS):
            n = rng.integers(8, 13)
            r[k, :n] = rng.choice(VOCAB, size=n, p=p) + 1
        out.append(r)
    return out

