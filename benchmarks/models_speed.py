"""Speed of rdpp's UpDown or Transformer against self-critical.pytorch's own module of that model
(``UpDownModel``, ``TransformerModel``) with the same weights, in the same process: an XE step, the
SCST and R-DPP steps at m = 5, and decoding 5 sampled captions per image.

Shapes (the model's paper preset: UpDown rnn 1000, word embedding 1000, attention hidden 512,
dropout 0.5; Transformer 6 + 6 layers, d_model 512, d_ff 2048, 8 heads, dropout 0.1): vocabulary
of 9,487 words (9,488 logits), 196 att regions of 2,048 features and fc = their mean, ``--batch``
(50) images in every row, 5 captions per image of 8-16 words (XE), captions of at most 16 words.
The model is random; for the RL steps the EOS logit's bias is set so that sampled captions average
``--words`` (9) words (as benchmarks/finetune.py does); for XE and decoding it is set so that no
caption ends early (every caption takes all 17 steps on both sides).

Rows (``--what``, each the step the stages run; both sides start from the same weights):

- ``xe``: rdpp's ``xe_loss`` (benchmarks/train.py ``rdpp_step``: backward, clipping by value 0.1,
  Adam) against the peer's ``LossWrapper`` XE path, backward, clipping and optimizer step
  (benchmarks/peer.py's ``Peer.xe_step``, as benchmarks/train.py times it for Att2in);
- ``scst``, ``dpp``: rdpp's ``RewardStep`` (benchmarks/finetune.py ``rdpp_step``): m = 5 samples
  per image drawn without gradients (+ the greedy baseline for SCST), CIDEr-D, one teacher-forced
  pass of the 5 x batch rows replaying the sampling dropout, backward and Adam; both against the
  peer's SCST step (``LossWrapper``'s ``sc_flag`` branch: greedy without gradients, then its
  ``_sample(sample_n=5)`` with gradients through the step loop, its ``get_self_critical_reward``
  with its CiderD, its ``RewardCriterion``, backward, clipping, Adam);
- ``decode``: 5 captions per image sampled at temperature 1 in eval mode without gradients: rdpp's
  ``decode`` (the Transformer's key/value cache) against the peer's ``_sample(sample_n=5)`` (its
  Transformer re-decodes the whole prefix at every step).

Checked first (a failed check stops the script): with dropout off, on 4 of the images, rdpp's
teacher-forced log-probs are within 1e-4 of the peer's and both decode the same greedy captions.

Timing (benchmarks/timing.py ``steps``): every side of a row group warmed up once (its FLOPs
counted), once more for its peak memory, then ``--repeat`` runs of every side, interleaved, each
waiting for the device (``--device cuda``: ``torch.cuda.synchronize`` before the clock is read);
medians (best beside) and the ratios of the medians (peer / rdpp: how many times faster rdpp is).
``--quick``: tiny sizes, at most 4 images, one repeat, to check that the script runs.

Memory: the peer's Transformer repeats the features per caption before its encoder, so its XE and
SCST steps at 50 images keep the encoder's activations for 250 copies of 196 x 2,048 features (its
XE step at 50 images did not fit in 23 GB beside other work). ``--batch`` applies to every row;
give a smaller one on a smaller machine.

    python benchmarks/models_speed.py --model updown|transformer [--what xe,scst,dpp,decode] [--batch 50]
                                      [--repeat 3] [--words 9] [--threads 2] [--device cpu|cuda]
                                      [--peer-repo PATH] [--quick] [--json]
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
from common import eos_probability  # noqa: E402
import peer  # noqa: E402
import peer_transformer  # noqa: E402
import peer_updown  # noqa: E402
import train  # noqa: E402
from timing import machine_info, steps, sync  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id  # noqa: E402
from rdpp_cli.models.base import sequence_logprobs  # noqa: E402
from rdpp_cli.models.registry import model_name, model_spec  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402


@dataclass(frozen=True)
class Shapes:
    vocab: int
    regions: int
    feat: int
    max_len: int
    sizes: dict  # overrides of the paper preset (empty: the paper's sizes)


PAPER = Shapes(9487, 196, 2048, 16, {})
QUICK = {"updown": Shapes(300, 9, 32, 8, dict(rnn_size=48, input_encoding_size=40, att_hid_size=24)),
         "transformer": Shapes(300, 9, 32, 8, dict(N_enc=2, N_dec=2, d_model=32, d_ff=64, num_att_heads=4))}
# the peer's module of each model: (its class name, benchmarks/peer_*.py's Peer around it, its name map)
PEERS = {"updown": ("UpDownModel", peer_updown.UpDownPeer, peer_updown.peer_name),
         "transformer": ("TransformerModel", peer_transformer.TransformerPeer, peer_transformer.peer_name)}
ALL = ("xe", "scst", "dpp", "decode")
M = 5  # samples per image (RL steps, decoding)


def output_bias(model: torch.nn.Module) -> str:
    """The name of the bias of ``model``'s output layer (the vocabulary's logits)."""
    V = model.config.vocab_size + 1
    return next(f"{n}.bias" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == V)


def make_model(name: str, s: Shapes, words: float, device, seed: int = 0):
    """A random model of ``name``'s paper preset (``s.sizes`` overriding), the EOS logit's bias set
    so that sampled captions average ``words`` words (the other logits are ≈ 0: P(EOS) = e^b / (e^b + V))."""
    torch.manual_seed(seed)
    model = model_spec(name).build("paper", vocab_size=s.vocab, att_feat_size=s.feat, fc_feat_size=s.feat,
                                   seq_length=s.max_len, **s.sizes)
    p = eos_probability(words, s.max_len)
    with torch.no_grad():
        model.get_parameter(output_bias(model))[0] = float(np.log(p * s.vocab / (1 - p))) if p > 0 else -30.0
    return model.to(device)


def make_batch(s: Shapes, B: int, device, seed: int = 0) -> Batch:
    """att ≥ 0 (CNN features), fc their mean, 5 captions per image of 8-16 words (at most max_len)."""
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(B, s.regions, s.feat, generator=g).relu_()
    labels = torch.randint(1, s.vocab + 1, (B, 5, s.max_len), generator=g)
    n = torch.randint(min(8, s.max_len), s.max_len + 1, (B, 5, 1), generator=g)
    labels = labels * (torch.arange(s.max_len) < n)
    return Batch(index=np.arange(B), fc=att.mean(1), att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=B).to(device)


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


def check_same_numbers(model, ref: peer.Peer, batch: Batch, max_len: int, images: int = 4) -> dict:
    """Dropout off, the batch's first ``images`` images, the EOS bias at 0 (full-length greedy
    captions): the largest difference of the teacher-forced log-probs of the batch's captions, and
    whether the greedy captions are the same."""
    fc, att, labels = batch.fc[:images], batch.att[:images], batch.labels[:images]
    name = output_bias(model)
    ours_b, theirs_b = model.get_parameter(name), ref.model.get_parameter(PEERS[model_name(model)][2](name))
    saved = ours_b[0].item()
    model.eval(), ref.model.eval()
    try:
        with torch.no_grad():
            ours_b[0] = theirs_b[0] = 0.0
            ours, mask = sequence_logprobs(model(att, labels, fc=fc), labels)
            bos = torch.cat([labels.new_zeros(*labels.shape[:2], 1), labels], 2)
            theirs, _ = sequence_logprobs(ref.model(fc, att, bos), labels)
            dec = decode(model, att, DecodeConfig(method="greedy", max_len=max_len), fc=fc)
            seq, _ = ref.model(fc, att, None, mode="sample", opt={"sample_method": "greedy"})
            ours_b[0] = theirs_b[0] = saved
    finally:
        model.train(), ref.model.train()
    T = dec.tokens.shape[-1]
    same = torch.equal(seq[:, :T], dec.tokens[:, 0]) and not seq[:, T:].any()
    return {"logprob": float((ours - theirs).abs()[mask.bool()].max()), "same_greedy_captions": bool(same)}


@dataclass
class Bench:
    """What every row group of one run shares."""

    model: str  # the registry name
    s: Shapes
    mods: peer.Modules
    device: torch.device
    batch: Batch
    words: float  # mean sampled caption length of the RL steps' model

    @property
    def title(self) -> str:
        return model_spec(self.model).title

    @property
    def peer_title(self) -> str:
        return f"self-critical.pytorch {PEERS[self.model][0]}"

    def pair(self, words: float, lr: float | None = None):
        """A fresh rdpp model and the peer's module (its LossWrapper, Adam at ``lr``, else the
        peer's default 4e-4) with the same weights, checked to compute the same numbers."""
        ours = make_model(self.model, self.s, words, self.device)
        theirs = PEERS[self.model][1](self.mods, ours, lr=lr)
        return ours, theirs, check_same_numbers(ours, theirs, self.batch, self.s.max_len)


def xe_sides(b: Bench) -> tuple[dict, list, dict]:
    """The XE step: rdpp's ``xe_loss`` + backward, clip, Adam against ``Peer.xe_step``."""
    ours, theirs, check = b.pair(words=b.s.max_len)  # XE: the EOS bias plays no part
    opt = torch.optim.Adam(ours.parameters(), lr=4e-4)  # the peer's default
    inputs = train.peer_inputs(b.batch)
    mine, ref = f"rdpp {b.title} xe", f"{b.peer_title} xe"
    sides = {mine: lambda: train.rdpp_step(ours, opt, b.batch, "fp32"), ref: lambda: theirs.xe_step(*inputs)}
    return sides, [("xe", mine, ref)], check


def rl_sides(b: Bench, rewards: list[str]) -> tuple[dict, list, dict]:
    """rdpp's ``RewardStep`` for each of ``rewards`` (scst, dpp) at m = 5 against the peer's SCST step."""
    rng = np.random.default_rng(0)
    train_refs, refs = make_refs(b.s, rng, 400), make_refs(b.s, rng, len(b.batch.index))
    E = eos_id(b.s.vocab)
    cider = TrainCider(doc_freq_with_eos([[r[r > 0].tolist() for r in img] for img in train_refs], E), E, b.s.max_len)
    ours, theirs, check = b.pair(b.words, lr=1e-6)  # tiny steps: the caption lengths stay put
    theirs.init_reward(train_refs, peer.workdir())
    opt = torch.optim.Adam(ours.parameters(), lr=1e-6)
    ref = f"{b.peer_title} scst m={M}"
    sides, pairs = {}, []
    for reward in rewards:
        st = RewardStep(data=None, cider=cider, reward=reward, m=M, max_len=b.s.max_len, seed=0)
        mine = f"rdpp {b.title} {reward} m={M}"
        sides[mine] = lambda st=st: finetune.rdpp_step(st, ours, opt, b.batch, refs, "fp32")
        pairs.append((f"{reward} m={M}", mine, ref))
    sides[ref] = lambda: theirs.scst_step(b.batch.fc, b.batch.att, refs, lambda: sync(b.device))
    return sides, pairs, check


def decode_sides(b: Bench) -> tuple[dict, list, dict]:
    """M sampled captions per image, eval mode, no gradients: rdpp's ``decode`` against the peer's ``_sample``."""
    ours, theirs, check = b.pair(words=b.s.max_len)  # no caption ends early: all 17 steps on both sides
    ours.eval(), theirs.model.eval()
    cfg = DecodeConfig(method="random", n=M, max_len=b.s.max_len)
    popt = {"sample_method": "sample", "sample_n": M}

    @torch.no_grad()
    def peer_decode():
        return theirs.model(b.batch.fc, b.batch.att, None, opt=popt, mode="sample")[0]

    mine, ref = f"rdpp {b.title} decode {M} samples", f"{b.peer_title} decode {M} samples"
    sides = {mine: lambda: decode(ours, b.batch.att, cfg, fc=b.batch.fc).tokens, ref: peer_decode}
    return sides, [(f"decode {M} samples", mine, ref)], check


def groups(b: Bench, what: list[str]):
    """(group name, builder) of each asked row group, in the order of ``ALL``."""
    rewards = [w for w in ("scst", "dpp") if w in what]
    out = [("xe", lambda: xe_sides(b))] if "xe" in what else []
    out += [("rl", lambda: rl_sides(b, rewards))] if rewards else []
    return out + ([("decode", lambda: decode_sides(b))] if "decode" in what else [])


def run(b: Bench, what: list[str], repeat: int) -> tuple[dict, list, dict]:
    """Each group built, checked (SystemExit if rdpp and the peer disagree), timed, then dropped."""
    timed, pairs, checks = {}, [], {}
    for name, build in groups(b, what):
        sides, p, check = build()
        checks[name] = check
        if not (check["logprob"] <= 1e-4 and check["same_greedy_captions"]):
            raise SystemExit(f"rdpp's {b.title} and the peer's {PEERS[b.model][0]} disagree ({name} model): {check}")
        timed.update(steps(sides, repeat, b.device))
        pairs += p
        del sides
    return timed, pairs, checks


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="Memory: the peer's Transformer repeats the features per caption before its "
                                        "encoder; its XE step at --batch 50 did not fit in 23 GB beside other work. "
                                        "--batch applies to every row: give a smaller one on a smaller machine.")
    ap.add_argument("--model", required=True, choices=sorted(PEERS), help="the rdpp model timed against the peer's")
    ap.add_argument("--what", default=",".join(ALL), help=f"comma-separated rows to time, of {', '.join(ALL)}")
    ap.add_argument("--batch", type=int, default=50, help="images per step in every row (memory: see below)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side, interleaved (after the warm-up)")
    ap.add_argument("--words", type=float, default=9.0, help="mean sampled caption length of the RL steps' model")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--peer-repo", default=None, help="self-critical.pytorch checkout (default: $SCP_REPO, then "
                                                      "the project's copy of 4c48a33)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, at most 4 images, one repeat: check that it runs")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    args = ap.parse_args(argv)
    args.what = [w.strip() for w in args.what.split(",") if w.strip()]
    bad = [w for w in args.what if w not in ALL]
    if bad or not args.what:
        ap.error(f"--what {','.join(bad) or '(empty)'}: give some of {', '.join(ALL)}")
    if args.quick:
        args.repeat, args.batch = 1, min(args.batch, 4)
    if args.batch < 1 or args.repeat < 1:
        ap.error("--batch and --repeat must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    s = QUICK[args.model] if args.quick else PAPER
    mods = peer.modules(peer.find_repo(args.peer_repo))
    b = Bench(args.model, s, mods, device, make_batch(s, args.batch, device), args.words)
    timed, pairs, checks = run(b, args.what, args.repeat)
    report(b, args, timed, pairs, checks)


def report(b: Bench, args, t: dict, pairs: list, checks: dict) -> None:
    m = machine_info()
    print(f"{b.title} against {b.peer_title}, {'quick sizes' if args.quick else 'paper preset'}, batch {args.batch} "
          f"images, vocab {b.s.vocab}, {b.s.regions}x{b.s.feat} att, on {args.device}; {m['machine']}; "
          f"{m['threads']} threads; seconds, medians of {args.repeat} interleaved runs per side")
    print(f"{'step':<56}{'median':>9}{'best':>9}{'images/s':>10}{'GFLOP':>8}{'peak MiB':>10}")
    for name, o in t.items():
        print(f"{name:<56}{o['median']:>9.3f}{o['best']:>9.3f}{args.batch / o['median']:>10.1f}"
              f"{o['gflop']:>8.0f}{o['peak_mib']:>10,.0f}")
    ratios = {f"{label}: peer / rdpp": t[ref]["median"] / t[mine]["median"] for label, mine, ref in pairs}
    print("ratios of medians (how many times faster rdpp is):")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}")
    for k, c in checks.items():
        print(f"checked first ({k} model): teacher-forced log-probs within {c['logprob']:.1e} of the peer's, "
              f"same greedy captions: {c['same_greedy_captions']}")
    if args.json:
        rows = {k: {kk: v for kk, v in o.items() if kk != "results"} for k, o in t.items()}
        print(json.dumps({"model": args.model, "batch": args.batch, "quick": args.quick, "device": args.device,
                          "machine": m, "steps": rows, "ratios": ratios, "checks": checks}))


if __name__ == "__main__":
    main()
