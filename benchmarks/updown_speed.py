"""Speed of rdpp's UpDown against self-critical.pytorch's own ``UpDownModel``: one XE step and one RL
step (SCST and R-DPP, m = 5) at the paper's shapes, on the CPU, the same weights on both sides.

Shapes: UpDown paper preset (configs/updown/updown.yml: rnn 1000, word embedding 1000, attention
hidden 512, dropout 0.5), vocabulary 9,487 words (9,488 logits), 196 att regions of 2,048 features
and fc = their mean, a batch of ``--batch`` (50) images, 5 captions per image of 8-16 words (XE),
captions of at most 16 words. The model is random; for the RL steps the EOS logit's bias is set so
that sampled captions average ``--words`` (9) words, as benchmarks/finetune.py does.

Sides (each step is what the stages run):

- XE: rdpp's ``xe_loss`` (benchmarks/train.py ``rdpp_step``: backward, clipping by value 0.1, Adam)
  against the peer's ``LossWrapper`` XE path and its optimizer step (benchmarks/peer_updown.py's
  ``UpDownPeer``, benchmarks/peer.py's ``Peer`` on the peer's UpDownModel);
- RL: rdpp's ``RewardStep`` (benchmarks/finetune.py ``rdpp_step``): m = 5 samples per image drawn
  on-policy without gradients (+ the greedy baseline in eval mode for SCST), CIDEr-D, then one
  teacher-forced pass of the 250 rows replaying the sampling dropout, backward and Adam; against the
  peer's SCST step (``LossWrapper``'s ``sc_flag`` branch: greedy without gradients, then
  ``_sample(sample_n=5)`` with gradients through the step loop, its ``get_self_critical_reward``
  with its CiderD, its ``RewardCriterion``, backward, clipping, Adam).

Checked first (a failed check stops the script): with dropout off, on 4 of the images, rdpp's
teacher-forced log-probs equal the peer's and both decode the same greedy captions.

Timing (benchmarks/timing.py ``steps``): each side warmed up once, once more for its peak memory,
then ``--repeats`` runs of every side, interleaved; medians (best beside) and the ratios of the
medians. ``--quick``: tiny sizes and one repeat, to check that the script runs.

    python benchmarks/updown_speed.py [--quick] [--repeats 3] [--batch 50] [--words 9] [--threads 2]
                                      [--what xe,rl] [--peer-repo PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune  # noqa: E402
import peer  # noqa: E402
import peer_updown  # noqa: E402
import train  # noqa: E402
from timing import machine_info, steps, sync  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id  # noqa: E402
from rdpp_cli.models.base import sequence_logprobs  # noqa: E402
from rdpp_cli.models.registry import model_spec  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402


@dataclass(frozen=True)
class Shapes:
    vocab: int
    regions: int
    feat: int
    max_len: int
    sizes: dict  # overrides of the paper preset (empty: the paper's sizes)


PAPER = Shapes(9487, 196, 2048, 16, {})
QUICK = Shapes(300, 9, 32, 8, dict(rnn_size=48, input_encoding_size=40, att_hid_size=24))
PEER_XE, PEER_SCST = "self-critical.pytorch UpDown xe", "self-critical.pytorch UpDown scst m=5"


def make_model(s: Shapes, words: float, seed: int = 0):
    torch.manual_seed(seed)
    model = model_spec("updown").build("paper", vocab_size=s.vocab, att_feat_size=s.feat, fc_feat_size=s.feat,
                                       seq_length=s.max_len, **s.sizes)
    p = finetune.eos_probability(words, s.max_len)
    with torch.no_grad():  # the other logits are ≈ 0: P(EOS) = e^b / (e^b + V)
        model.logit.bias[0] = float(np.log(p * s.vocab / (1 - p))) if p > 0 else -30.0
    return model


def make_batch(s: Shapes, B: int, seed: int = 0) -> Batch:
    """att ≥ 0 (CNN features), fc their mean, 5 captions per image of 8-16 words (at most max_len)."""
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(B, s.regions, s.feat, generator=g).relu_()
    labels = torch.randint(1, s.vocab + 1, (B, 5, s.max_len), generator=g)
    n = torch.randint(min(8, s.max_len), s.max_len + 1, (B, 5, 1), generator=g)
    labels = labels * (torch.arange(s.max_len) < n)
    return Batch(index=np.arange(B), fc=att.mean(1), att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=B)


def make_refs(s: Shapes, rng: np.random.Generator, n_images: int) -> list[np.ndarray]:
    """5 references per image of 6-min(12, max_len) words, Zipf-like over the vocabulary."""
    p = 1.0 / np.arange(1, s.vocab + 1) ** 1.1
    p /= p.sum()
    out = []
    for _ in range(n_images):
        r = np.zeros((5, s.max_len), np.int64)
        for k in range(5):
            n = rng.integers(6, min(12, s.max_len) + 1)
            r[k, :n] = rng.choice(s.vocab, size=n, p=p) + 1
        out.append(r)
    return out


def check_same_numbers(model, ref: peer_updown.UpDownPeer, batch: Batch, max_len: int, images: int = 4) -> dict:
    """Dropout off, the batch's first ``images`` images: the largest difference of the teacher-forced
    log-probs of the batch's captions, and whether the greedy captions are the same."""
    fc, att, labels = batch.fc[:images], batch.att[:images], batch.labels[:images]
    bias = model.logit.bias[0].item()
    model.eval(), ref.model.eval()
    try:
        with torch.no_grad():
            model.logit.bias[0] = ref.model.logit.bias[0] = 0.0  # full-length greedy captions
            ours, mask = sequence_logprobs(model(att, labels, fc=fc), labels)
            bos = torch.cat([labels.new_zeros(*labels.shape[:2], 1), labels], 2)
            theirs, _ = sequence_logprobs(ref.model(fc, att, bos), labels)
            dec = decode(model, att, DecodeConfig(method="greedy", max_len=max_len), fc=fc)
            seq, _ = ref.model(fc, att, None, mode="sample", opt={"sample_method": "greedy"})
            model.logit.bias[0] = ref.model.logit.bias[0] = bias
    finally:
        model.train(), ref.model.train()
    T = dec.tokens.shape[-1]
    same = torch.equal(seq[:, :T], dec.tokens[:, 0]) and not seq[:, T:].any()
    return {"logprob": float((ours - theirs).abs()[mask.bool()].max()), "same_greedy_captions": bool(same)}


def build_sides(args, s: Shapes, mods: peer.Modules) -> tuple[dict, dict]:
    """The timed steps by name, and the numbers checked first."""
    batch = make_batch(s, args.batch)
    rng = np.random.default_rng(0)
    train_refs = make_refs(s, rng, 400)
    refs = make_refs(s, rng, args.batch)
    cider = TrainCider(doc_freq_with_eos([[r[r > 0].tolist() for r in img] for img in train_refs], eos_id(s.vocab)),
                       eos_id(s.vocab), s.max_len)
    sides = {}
    checks = {}
    if "xe" in args.what:
        ours = make_model(s, words=s.max_len)  # XE: the EOS bias plays no part
        theirs = peer_updown.UpDownPeer(mods, ours)  # Adam at lr 4e-4: the peer's default
        checks["xe"] = check_same_numbers(ours, theirs, batch, s.max_len)
        opt = torch.optim.Adam(ours.parameters(), lr=4e-4)
        inputs = train.peer_inputs(batch)
        sides["rdpp UpDown xe fp32"] = lambda: train.rdpp_step(ours, opt, batch, "fp32")
        sides[PEER_XE] = lambda: theirs.xe_step(*inputs)
    if "rl" in args.what:
        ours_rl = make_model(s, args.words)
        theirs_rl = peer_updown.UpDownPeer(mods, ours_rl, lr=1e-6)
        theirs_rl.init_reward(train_refs, peer.workdir())
        checks["rl"] = check_same_numbers(ours_rl, theirs_rl, batch, s.max_len)
        opt_rl = torch.optim.Adam(ours_rl.parameters(), lr=1e-6)  # tiny steps: the caption lengths stay put
        for reward in ("scst", "dpp"):
            st = RewardStep(data=None, cider=cider, reward=reward, m=5, max_len=s.max_len, seed=0)
            sides[f"rdpp UpDown {reward} m=5 fp32"] = (
                lambda st=st: finetune.rdpp_step(st, ours_rl, opt_rl, batch, refs, "fp32"))
        sides[PEER_SCST] = lambda: theirs_rl.scst_step(batch.fc, batch.att, refs, lambda: sync("cpu"))
    return sides, checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat: check that the script runs")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per side, interleaved (after the warm-up)")
    ap.add_argument("--batch", type=int, default=50, help="images per step")
    ap.add_argument("--words", type=float, default=9.0, help="mean sampled caption length of the RL steps' model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--what", default="xe,rl", help="steps to time: xe, rl or both")
    ap.add_argument("--peer-repo", default=None, help="self-critical.pytorch checkout (default: $SCP_REPO, then "
                                                       "the project's copy of 4c48a33)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    args = ap.parse_args()
    s = QUICK if args.quick else PAPER
    if args.quick:
        args.repeats, args.batch = 1, min(args.batch, 4)
    args.what = args.what.split(",")
    torch.set_num_threads(args.threads)
    mods = peer.modules(peer.find_repo(args.peer_repo))
    sides, checks = build_sides(args, s, mods)
    bad = {k: c for k, c in checks.items() if not (c["logprob"] <= 1e-4 and c["same_greedy_captions"])}
    if bad:
        raise SystemExit(f"rdpp's UpDown and the peer's disagree: {bad}")
    t = steps(sides, args.repeats, torch.device("cpu"))
    report(t, checks, args, s)


def report(t: dict, checks: dict, args, s: Shapes) -> None:
    m = machine_info()
    print(f"UpDown steps, {'quick sizes' if args.quick else 'paper preset'}, batch {args.batch} images, vocab "
          f"{s.vocab}, {s.regions}x{s.feat} att; {m['machine']}; {m['threads']} threads; seconds, medians of "
          f"{args.repeats} interleaved runs per side")
    print(f"{'step':<40}{'median':>9}{'best':>9}{'images/s':>10}{'GFLOP':>8}{'peak MiB':>10}")
    for name, o in t.items():
        print(f"{name:<40}{o['median']:>9.3f}{o['best']:>9.3f}{args.batch / o['median']:>10.1f}"
              f"{o['gflop']:>8.0f}{o['peak_mib']:>10,.0f}")
    ratios = {}
    if PEER_XE in t:
        ratios["xe: peer / rdpp"] = t[PEER_XE]["median"] / t["rdpp UpDown xe fp32"]["median"]
    if PEER_SCST in t:
        for reward in ("scst", "dpp"):
            ratios[f"{reward} m=5: peer scst / rdpp"] = t[PEER_SCST]["median"] / t[f"rdpp UpDown {reward} m=5 fp32"]["median"]
    print("ratios of medians (how many times faster rdpp is):")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}")
    for k, c in checks.items():
        print(f"checked first ({k} model): teacher-forced log-probs within {c['logprob']:.1e} of the peer's, "
              f"same greedy captions: {c['same_greedy_captions']}")
    if args.json:
        print(json.dumps({"machine": m, "steps": {k: {kk: v for kk, v in o.items() if kk != "results"}
                                                  for k, o in t.items()}, "ratios": ratios, "checks": checks}))


if __name__ == "__main__":
    main()
