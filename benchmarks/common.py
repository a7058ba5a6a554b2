"""What the benchmarks here share: COCO's shapes (the paper presets: 9,487 words, 196 att regions of
2,048 features, captions of at most 16 words, 5 per image, batches of 50; ``QUICK``: tiny sizes for
a CPU check), the models at those shapes, seeded synthetic batches, references and COCO-shaped data
artifacts (two sides of a benchmark, and two runs of it, get the same numbers), the recipes' settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rdpp_cli.data.loader import Batch
from rdpp_cli.models.registry import model_spec

VOCAB, REGIONS, ATT_DIM, SEQ_LEN, SEQ_PER_IMG, BATCH = 9487, 196, 2048, 16, 5, 50
REFS = 5  # references per image
ROW_BYTES = (REGIONS * ATT_DIM + ATT_DIM) * 2  # one image's att + fc features in float16 (0.81 MB)
COCO_TRAIN_IMAGES, COCO_VAL_IMAGES = 113_287, 5_000  # the Karpathy split (restval in train)


@dataclass(frozen=True)
class Shapes:
    vocab: int = VOCAB
    regions: int = REGIONS
    feat: int = ATT_DIM
    max_len: int = SEQ_LEN
    sizes: dict = field(default_factory=dict)  # overrides of the model's paper preset (empty: its sizes)


PAPER = Shapes()
QUICK = {"att2in": Shapes(300, 9, 32, 8, dict(rnn_size=48, input_encoding_size=40, att_hid_size=24)),
         "updown": Shapes(300, 9, 32, 8, dict(rnn_size=48, input_encoding_size=40, att_hid_size=24)),
         "transformer": Shapes(300, 9, 32, 8, dict(N_enc=2, N_dec=2, d_model=32, d_ff=64, num_att_heads=4))}


def recipe(model: str, stage: str, preset: str = "paper") -> dict:
    """The settings of ``model``'s ``stage`` recipe ``preset`` (``xe``: ``epochs``, ``batch_size`` and
    ``ss_epochs``, the epochs that run scheduled sampling; ``finetune``: its preset's settings): the
    one place the benchmarks read the recipes."""
    from rdpp_cli.training import options

    if stage == "xe":
        o = options.XEOptions(model=model, preset=preset).with_preset()
        return {"epochs": o.epochs, "batch_size": o.batch_size, "ss_epochs": sum(o.ss_prob(e) > 0 for e in range(o.epochs))}
    return model_spec(model).recipe("finetune", preset)


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


def output_bias(model: torch.nn.Module) -> str:
    """The name of the bias of ``model``'s output layer (the vocabulary's logits)."""
    V = model.config.vocab_size + 1
    return next(f"{n}.bias" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == V)


def make_model(name: str = "att2in", s: Shapes = PAPER, words: float | None = None, device="cpu", seed: int = 0):
    """A random ``name`` of its paper preset at ``s``'s shapes (``torch.manual_seed(seed)`` first).
    ``words``: the EOS logit's bias set so that sampled captions have that many words on average
    (the other logits are ≈ 0: P(EOS) = e^b / (e^b + V)); ``s.max_len`` or more: no caption ends early."""
    torch.manual_seed(seed)
    model = model_spec(name).build("paper", vocab_size=s.vocab, att_feat_size=s.feat, fc_feat_size=s.feat,
                                   seq_length=s.max_len, **s.sizes)
    if words is not None:
        p = eos_probability(words, s.max_len)
        with torch.no_grad():
            model.get_parameter(output_bias(model))[0] = float(np.log(p * s.vocab / (1 - p))) if p > 0 else -30.0
    return model.to(device)


def features(images: int, generator: torch.Generator, s: Shapes = PAPER) -> torch.Tensor:
    """(images, regions, feat) att features: Gaussian, cut at 0 as a CNN's are."""
    return torch.randn(images, s.regions, s.feat, generator=generator).relu_()


def make_batch(images: int, words: tuple[int, int] | None = None, device="cpu", seed: int = 0,
               s: Shapes = PAPER) -> Batch:
    """A training batch of ``images`` images: features, and with ``words`` (MIN, MAX) SEQ_PER_IMG
    random captions per image of MIN..MAX words (uniform, at most ``s.max_len``); without, one empty
    caption per image (the RL steps sample their own)."""
    g = torch.Generator().manual_seed(seed)
    att, L = features(images, g, s), s.max_len
    if words is None:
        labels = torch.zeros(images, 1, L, dtype=torch.long)
    else:
        labels = torch.randint(1, s.vocab + 1, (images, SEQ_PER_IMG, L), generator=g)
        n = torch.randint(min(words[0], L), min(words[1], L) + 1, (images, SEQ_PER_IMG, 1), generator=g)
        labels = labels * (torch.arange(L) < n)
    return Batch(index=np.arange(images), fc=att.mean(1), att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=images).to(device)


def zipf_p(exponent: float = 1.1, vocab: int = VOCAB) -> np.ndarray:
    """Word frequencies over the vocabulary ∝ 1 / rank^exponent (word i + 1 has rank i + 1)."""
    p = 1.0 / np.arange(1, vocab + 1) ** exponent
    return p / p.sum()


def make_refs(rng: np.random.Generator, n_images: int, s: Shapes = PAPER) -> list[np.ndarray]:
    """REFS references per image, (REFS, max_len) word ids each: 8–12 Zipf-distributed words, 0-padded."""
    L = s.max_len
    refs = rng.choice(s.vocab, size=(n_images, REFS, L), p=zipf_p(vocab=s.vocab)) + 1
    refs[np.arange(L) >= rng.integers(min(8, L), min(12, L) + 1, (n_images, REFS, 1))] = 0
    return list(refs)


# -- COCO-shaped data artifacts on disk ---------------------------------------------------------------

def feature_blocks(rows: int, block: int, seed: int = 0):
    """(start, fc, att) blocks of synthetic CNN-like features (≥ 0, fp16); row i carries i in att[i, 0, 0]."""
    base = np.maximum(np.random.default_rng(seed).standard_normal((256, REGIONS, ATT_DIM), dtype=np.float32), 0)
    base = base.astype(np.float16)
    for s in range(0, rows, block):
        k = min(block, rows - s)
        att = base[np.arange(s, s + k) % len(base)]  # a new array (fancy indexing copies)
        att[:, 0, 0] = np.arange(s, s + k) % 2048
        yield s, att.mean(1, dtype=np.float32).astype(np.float16), att


def feature_writer(path: Path, rows: int, block: int, cls=None):
    """A ``FeatureWriter`` (or its subclass ``cls``) of ``rows`` COCO-shaped images, ids 1..rows."""
    from rdpp_cli.data.features import FeatureWriter

    return (cls or FeatureWriter)(path, np.arange(1, rows + 1), fc_dim=ATT_DIM, regions=REGIONS, block=block,
                                  attrs={"backbone": "synthetic", "att_size": 14})


def write_artifact(path: Path, rows: int, npy_dir: Path | None = None, seed: int = 0, real_df: bool = False,
                   block: int = 500, val: int = 0) -> dict:
    """A data artifact of ``rows`` COCO-shaped images (the last ``val`` in the val split, the others
    in train), features by FeatureWriter;
    optionally the same features as ``att.npy`` / ``fc.npy`` in ``npy_dir``. ``real_df``: the
    training document frequencies of its captions (the end token counted, as ``prepro`` makes
    them: what the RL reward looks up) instead of an empty table."""
    import h5py

    from rdpp_cli.artifacts import write_manifest
    from rdpp_cli.metrics.cider import DocFreq
    from rdpp_cli.metrics.train_cider import doc_freq_with_eos, eos_id

    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ids = np.arange(1, rows + 1, dtype=np.int64)
    (path / "vocab.json").write_text(json.dumps({"words": [f"w{i}" for i in range(VOCAB - 1)] + ["UNK"]}))
    n_cap = 5 * rows
    lens = rng.integers(8, SEQ_LEN + 1, n_cap)
    labels = rng.integers(1, VOCAB + 1, (n_cap, SEQ_LEN)).astype(np.int32)
    labels[np.arange(SEQ_LEN)[None, :] >= lens[:, None]] = 0
    with h5py.File(path / "captions.h5", "w") as f:
        f["labels"], f["lengths"] = labels, lens.astype(np.int32)
        f["label_start"] = np.arange(0, n_cap, 5, dtype=np.int64)
        f["label_end"] = np.arange(5, n_cap + 5, 5, dtype=np.int64)
        f["image_ids"] = ids
        f["split"] = np.array([b"train"] * (rows - val) + [b"val"] * val, dtype="S5")
        f.create_dataset("raw", data=np.array(["x"] * n_cap, dtype=object), dtype=h5py.string_dtype())
    if real_df:
        caps = [[c[c > 0].tolist() for c in labels[5 * i:5 * i + 5]] for i in range(rows)]
        df = doc_freq_with_eos(caps, eos_id(VOCAB))
    df = df if real_df else DocFreq(np.zeros((0, 4), np.int32), np.zeros(0), rows)
    df.save_h5(path / "cider_df.h5")
    w = feature_writer(path / "features.h5", rows, block)
    maps = {}
    if npy_dir is not None:
        npy_dir.mkdir(parents=True, exist_ok=True)
        maps = {k: np.lib.format.open_memmap(npy_dir / f"{k}.npy", "w+", np.float16, (rows, *shape))
                for k, shape in (("fc", (ATT_DIM,)), ("att", (REGIONS, ATT_DIM)))}
    for s, fc, att in feature_blocks(rows, block, seed):
        w.write(fc, att)
        for k, x in zip(maps, (fc, att)):
            maps[k][s:s + len(x)] = x
    for m in maps.values():
        m.flush()
    write_manifest(path, "rdpp.data", {"source": "benchmarks/common.py", "rows": rows},
                   precomputed={"features.h5": w.finish()})
    with h5py.File(path / "features.h5") as f:
        layout = {k: {"chunks": f[k].chunks, "compression": f[k].compression} for k in ("att", "fc")}
    return {"rows": rows, "features_gb": (path / "features.h5").stat().st_size / 1e9, "layout": layout}
