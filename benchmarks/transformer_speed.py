"""Speed of rdpp's Transformer against self-critical.pytorch's own TransformerModel (the peer),
same weights, same process, on the CPU: an XE training step, and decoding m sampled captions per
image.

Shapes (the paper preset: 6 + 6 layers, d_model 512, d_ff 2048, 8 heads, dropout 0.1, att
dropout 0.5; COCO's sizes): vocabulary of 9,487 words, 196 att regions of 2,048 features, a batch
of ``--batch`` images (50).

- XE step: 5 captions per image of ``--words`` words (8-16, each caption's length drawn
  uniformly); rdpp runs ``training.xe.xe_loss`` (train mode), the peer its ``LossWrapper``'s XE
  path as its tools/train.py calls it; then backward, clipping by value 0.1 (the peer's default)
  and an Adam step on both sides.
- Decoding: ``--m`` (5) captions per image sampled at temperature 1 in eval mode, up to 16 words
  (the untrained model almost never samples the EOS: every caption takes all 17 steps on both
  sides); rdpp's ``decode`` with its key/value cache, the peer's ``_sample`` (``sample_n`` = m),
  which re-decodes the whole prefix at every step.

Before timing, the script checks on 2 images in fp32 eval mode that both compute the same
teacher-forced log-probs. Timing: one warm-up call per side, then ``--repeat`` calls per side,
interleaved (benchmarks/timing.py), medians (best beside). ``--quick``: tiny sizes, one repeat,
to check that the script runs. Memory: the peer's XE step at 50 images keeps the activations of
its encoder over 250 copies of the features (it repeats them per caption before encoding), more
than a 23 GB machine shared with other work could give; ``--batch`` smaller there.

    python benchmarks/transformer_speed.py [--repeat 3] [--batch 50] [--m 5] [--threads 2]
                                           [--what xe,decode] [--peer-repo PATH] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402
from peer_transformer import peer_labels, peer_transformer  # noqa: E402
from timing import interleaved, machine  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.base import sequence_logprobs  # noqa: E402
from rdpp_cli.models.registry import model_spec  # noqa: E402
from rdpp_cli.training.xe import xe_loss  # noqa: E402

PAPER = dict(vocab=9487, regions=196, att_dim=2048, seq_len=16, words=(8, 16), sizes={})
QUICK = dict(vocab=50, regions=6, att_dim=16, seq_len=8, words=(3, 8),
             sizes=dict(N_enc=2, N_dec=2, d_model=32, d_ff=64, num_att_heads=4))


def make_batch(shape: dict, batch: int, per_image: int = 5, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(batch, shape["regions"], shape["att_dim"], generator=g).relu_()  # CNN features are ≥ 0
    L = shape["seq_len"]
    labels = torch.randint(1, shape["vocab"] + 1, (batch, per_image, L), generator=g)
    lo, hi = shape["words"]
    labels *= torch.arange(L) < torch.randint(lo, hi + 1, (batch, per_image, 1), generator=g)
    return Batch(index=np.arange(batch), fc=att.mean(1), att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=batch)


def adam(model) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-9)


def rdpp_xe_step(model, opt, batch: Batch) -> float:
    loss = xe_loss(model, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    return loss.item()


def peer_xe_step(lw, opt, batch: Batch) -> float:
    labels, masks = peer.xe_labels(batch.labels)
    gts = list(batch.labels.numpy())
    out = lw(batch.fc, batch.att, labels, masks, None, gts, torch.arange(len(gts)), False, False, False)
    loss = out["loss"].mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_value_(lw.model.parameters(), 0.1)
    opt.step()
    return loss.item()


def check_same_math(model, theirs, batch: Batch) -> float:
    """Largest |difference| of the counted teacher-forced log-probs on 2 images (fp32, eval)."""
    model.eval(), theirs.eval()
    att, seqs = batch.att[:2], batch.labels[:2]
    with torch.no_grad():
        ours, _ = sequence_logprobs(model(att, seqs), seqs)
        ref, _ = sequence_logprobs(theirs(batch.fc[:2], att, peer_labels(seqs.reshape(-1, seqs.shape[-1]))), seqs)
    return float((ours - ref).abs().max())


def xe_sides(model, mods, batch: Batch) -> dict:
    ours = copy.deepcopy(model).train()
    theirs = peer_transformer(mods, model).train()
    lw = mods.LossWrapper(theirs, theirs.opt)
    o1, o2 = adam(ours), adam(theirs)
    return {"rdpp": lambda: rdpp_xe_step(ours, o1, batch), "self-critical.pytorch": lambda: peer_xe_step(lw, o2, batch)}


def decode_sides(model, mods, batch: Batch, m: int, max_len: int) -> dict:
    ours = copy.deepcopy(model).eval()
    theirs = peer_transformer(mods, model, max_length=max_len).eval()
    cfg = DecodeConfig(method="random", n=m, max_len=max_len)
    popt = {"sample_method": "sample", "sample_n": m}

    @torch.no_grad()
    def peer_decode():
        return theirs(batch.fc, batch.att, None, opt=popt, mode="sample")[0]

    return {"rdpp": lambda: decode(ours, batch.att, cfg).tokens,
            "self-critical.pytorch": peer_decode}


def run(what: str, sides: dict, repeat: int) -> dict:
    for fn in sides.values():  # warm-up
        fn()
    t = interleaved(sides, repeat)
    ref = t["self-critical.pytorch"].median
    return {name: (x.median, x.best, ref / x.median) for name, x in t.items()}


def print_table(title: str, rows: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("side", "median s", "best s", "speed-up vs peer"):
        table.add_column(col, justify="right")
    for name, (med, best, ratio) in rows.items():
        table.add_row(name, f"{med:.3f}", f"{best:.3f}", f"{ratio:.2f}×")
    Console(width=130).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per side, interleaved (median reported)")
    ap.add_argument("--batch", type=int, default=50, help="images")
    ap.add_argument("--m", type=int, default=5, help="sampled captions per image when decoding")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--what", default="xe,decode", help="xe, decode or both")
    ap.add_argument("--peer-repo", default=None, help="self-critical.pytorch checkout (default: $SCP_REPO, then "
                                                      "the project's copy of 4c48a33)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and one repeat: check that the script runs")
    args = ap.parse_args()
    shape = QUICK if args.quick else PAPER
    repeat, B = (1, min(args.batch, 4)) if args.quick else (args.repeat, args.batch)
    torch.set_num_threads(args.threads)
    mods = peer.modules(peer.find_repo(args.peer_repo))
    torch.manual_seed(0)
    model = model_spec("transformer").build("paper", vocab_size=shape["vocab"], att_feat_size=shape["att_dim"],
                                            seq_length=shape["seq_len"], **shape["sizes"])
    batch = make_batch(shape, B)
    diff = check_same_math(model, peer_transformer(mods, model), batch)
    if not diff <= 1e-4:
        raise SystemExit(f"rdpp and the peer disagree: teacher-forced log-probs differ by {diff:.2e}")
    c = model.config
    where = f"{machine()}; {args.threads} threads"
    sizes = f"{c.N_enc}+{c.N_dec} layers, d_model {c.d_model}, V={c.vocab_size}, {shape['regions']}×{c.att_feat_size} att"
    print(f"same teacher-forced log-probs (2 images, fp32, eval): max |difference| {diff:.1e}")
    if "xe" in args.what:
        words = float((batch.labels > 0).sum(-1).float().mean())
        print_table(f"XE step ({sizes}; {B} images × 5 captions of {words:.1f} words) on {where}; "
                    f"median of {repeat} interleaved", run("xe", xe_sides(model, mods, batch), repeat))
    if "decode" in args.what:
        print_table(f"decoding {args.m} sampled captions × {B} images, {c.seq_length} words ({sizes}) on {where}; "
                    f"median of {repeat} interleaved",
                    run("decode", decode_sides(model, mods, batch, args.m, c.seq_length), repeat))


if __name__ == "__main__":
    main()
