"""Step time of RL fine-tuning (SCST and R-DPP) at the paper's shapes, split into decode / reward /
backward: rdpp in fp32 and bf16 against self-critical.pytorch today and the published R-DPP code's way.

Shapes (the paper preset): Att2in 512/512/512, vocabulary 9,487 words, 14×14×2048 att features,
a batch of 50 images, captions of up to 16 words, 5 references per image of 8–12 words. The model
is random, with the EOS logit's bias set so that sampled captions have ``--words`` words on average
(a controlled setting: 9 is about what a COCO-trained model samples, 15.5 what an untrained one
does); both sides sample from the same weights, so from the same caption-length distribution, and
the mean length each side actually sampled is printed beside its times.

Each rdpp step is exactly what ``rdpp finetune`` runs (``rdpp_cli.training.finetune.RewardStep``
under ``--precision``'s autocast):

- decode:   M samples per image drawn on-policy (dropout on, masks drawn in advance), batched, no
            grad (+ one greedy caption per image, eval mode, for SCST);
- reward:   CIDEr-D (training df, end token counted) of the samples (and greedy captions) in one
            call; R-DPP: the pairwise kernel in the same pass and the batched float64 DPP weights;
- backward: one teacher-forced pass replaying the sampling masks, the policy-gradient loss,
            backward, clipping by value 0.1 and the Adam step.

References, float32, on the same weights and batch, run by the peer's own code (benchmarks/peer.py:
self-critical.pytorch's modules, unmodified, found by ``--peer-repo`` or ``$SCP_REPO``):

- ``self-critical.pytorch scst`` (m = 5): ``LossWrapper.forward``'s ``sc_flag`` branch call for call
  (a clock between the calls): a greedy ``_sample`` in eval mode without gradients, then
  ``_sample(sample_n=5)`` in train mode with gradients through the step loop (features and keys
  copied per sample by ``repeat_tensors``, the full log-softmax of each step kept),
  ``get_self_critical_reward`` with its ``CiderD`` (pure Python on the CPU, the fixed training df
  made by its ``prepro_ngrams.get_doc_freq``, captions and references as its ``array_to_str``
  writes them: the end token included) and its ``RewardCriterion``; then tools/train.py's backward,
  clipping and Adam step;
- ``published dpp`` (m = 5): the R-DPP authors' way, which self-critical.pytorch does not ship: their
  published code is a fork of self-critical.pytorch whose step draws the M samples by M separate
  ``_sample`` calls, scores q with M ``CiderD`` calls, builds the similarity kernel with
  M(M+1)/2 ``CiderD`` calls (caption j against caption i as the only reference) and inverts it with
  ``np.linalg.inv`` (the sign cut), then weights each sample's ``RewardCriterion``; composed here
  from the peer's model, ``CiderD``, ``RewardCriterion`` and optimizer.

Before timing, the script checks that both sides compute the same numbers: on one set of rdpp's
captions the peer's q, kernel, R-DPP weights and SCST advantages equal rdpp's (to 1e-9); in eval
mode both models decode the same greedy captions with the same log-probabilities; and the inlined
SCST branch gives the loss of the peer's ``LossWrapper`` run end to end on the same random stream.

Timing (benchmarks/timing.py ``steps``): every setting warmed up once (its matrix-product FLOPs
counted) and run once more, untimed, for its peak memory; then ``--repeats`` runs of every setting
in turns (the order reversed every other round); medians of each phase and of the total (best
beside); peak memory; the matmul rate of this device measured in the same run.

    python benchmarks/finetune.py [--ms 2,3,4,5,6,7] [--precision fp32,bf16] [--words 9] [--repeats 3]
                                  [--batch 50] [--threads 2] [--device cpu] [--peer-repo PATH] [--no-reference]
                                  [--sample-modes] [--json]

Targets: an R-DPP step at most 1.2× an SCST step with the same M; an SCST step (M = 5 plus
the greedy baseline) at ≥ 10 images/s and twice the reference's images/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402
from common import ATT_DIM, REGIONS, SEQ_LEN as MAX_LEN, VOCAB, make_batch, make_refs, paper_model  # noqa: E402
from timing import machine_info, steps_on_roofline, sync  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id  # noqa: E402
from rdpp_cli.models.att2in import Att2in  # noqa: E402
from rdpp_cli.precision import autocast  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402
from rdpp_cli.training.rewards import dpp_weights, scst_advantage  # noqa: E402

mean_words = peer.mean_words


# ----------------------------------------------------------------------------------------------
# rdpp's step, timed in its three parts
# ----------------------------------------------------------------------------------------------

def rdpp_step(step: RewardStep, model: Att2in, opt: torch.optim.Optimizer, batch: Batch,
              refs: list[np.ndarray], precision: str) -> dict[str, float]:
    device = batch.att.device
    t0 = time.perf_counter()
    model.train()
    with autocast(precision, device):
        d = step.draw(model, batch)
    samples_np = d.samples.cpu().numpy()  # (waits for the GPU, if any)
    t1 = time.perf_counter()
    w, _ = step.weights(samples_np, d.greedy, refs)
    t2 = time.perf_counter()
    with autocast(precision, device):
        loss, _ = step.loss(model, batch, d, w)
    _update(model, opt, loss)
    t3 = time.perf_counter()
    return {"decode": t1 - t0, "reward": t2 - t1, "backward": t3 - t2, "words": mean_words(samples_np)}


def _update(model, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """Backward, clipping (value 0.1, as rdpp and self-critical.pytorch) and the Adam step; returns
    once the GPU, if any, has finished, so the caller's clock covers the work."""
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync(loss.device)


# ----------------------------------------------------------------------------------------------
# the checks against the peer
# ----------------------------------------------------------------------------------------------

def check_same_numbers(model: Att2in, ref: peer.Peer, cider: TrainCider, batch: Batch,
                       refs: list[np.ndarray]) -> dict[str, float]:
    """Largest differences between rdpp and the peer on the same captions: q, the kernel, the
    R-DPP weights and the SCST advantages; in eval mode, the greedy captions and their log-probs;
    and the inlined SCST branch against the peer's LossWrapper end to end."""
    step = RewardStep(data=None, cider=cider, reward="dpp", m=5, max_len=MAX_LEN, seed=1)
    d = step.draw(model, batch)
    samples = d.samples.cpu().numpy()
    B, M, T = samples.shape
    q, S = cider.score_and_pairwise(samples, refs)
    w = dpp_weights(torch.from_numpy(q), torch.from_numpy(S)).numpy()
    caps = [np.pad(samples[:, i], ((0, 0), (0, MAX_LEN - T))) for i in range(M)]
    q_r, S_r, w_r = ref.dpp_weights(caps, refs)
    # greedy captions without the EOS bias (with it, greedy decoding stops at once): full-length captions
    bias = model.logit.bias[0].item()
    model.eval(), ref.model.eval()
    with torch.no_grad():
        model.logit.bias[0] = ref.model.logit.bias[0] = 0.0
        ours = decode(model, batch.att, DecodeConfig(method="greedy", max_len=MAX_LEN))
        seq_r, lp_r = ref.model(batch.fc, batch.att, None, mode="sample", opt={"sample_method": "greedy"})
        model.logit.bias[0] = ref.model.logit.bias[0] = bias
    model.train(), ref.model.train()
    greedy = ours.tokens[:, 0].cpu().numpy()
    g = cider.score(greedy, refs)
    adv = scst_advantage(torch.from_numpy(q), torch.from_numpy(g)).numpy()
    adv_r = ref.self_critical_reward(seq_r, refs, torch.from_numpy(samples.reshape(B * M, T)))
    Tg = greedy.shape[1]
    same_greedy = np.array_equal(seq_r.cpu().numpy()[:, :Tg], greedy) and not seq_r[:, Tg:].any()
    lp_chosen = lp_r.gather(2, seq_r.unsqueeze(2)).squeeze(2)[:, :Tg]
    ours_lp = ours.logprobs[:, 0, :Tg]
    losses = []
    for run in (lambda: ref.lw_scst_loss(batch.fc, batch.att, refs),
                lambda: ref.scst_parts(batch.fc, batch.att, refs)[0]):
        torch.manual_seed(7)
        with torch.no_grad():
            losses.append(float(run()))
    return {"q": float(np.abs(q - q_r).max()), "kernel": float(np.abs(S - S_r).max()),
            "dpp_weights": float(np.abs(w - w_r).max()),
            "scst_advantage": float(np.abs(adv.reshape(-1) - adv_r[:, 0]).max()),
            "same_greedy_captions": bool(same_greedy),
            "greedy_logprob": float((lp_chosen - ours_lp).abs().max()) if same_greedy else float("inf"),
            "scst_inlined_vs_losswrapper": abs(losses[0] - losses[1])}


# ----------------------------------------------------------------------------------------------

PHASES = ("decode", "reward", "backward")
PEER_SCST, PUBLISHED = "self-critical.pytorch scst m=5 fp32", "published dpp m=5 fp32"


def summarise(o: dict) -> dict:
    """Medians (and the best) of a setting's timed runs, per phase and in total."""
    runs = o["results"]
    out = {p: float(np.median([r[p] for r in runs])) for p in PHASES}
    out.update(total=o["median"], best=o["best"], times=o["times"], peak_mib=o["peak_mib"],
               words=float(np.mean([r["words"] for r in runs])))
    return out


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=50, help="images per step")
    ap.add_argument("--ms", default="2,3,4,5,6,7", help="samples per image to time")
    ap.add_argument("--precision", default="fp32,bf16", help="rdpp's precisions to time, comma-separated")
    ap.add_argument("--words", type=float, default=9.0,
                    help="mean sampled caption length the random model is set to (9 ≈ a trained COCO model, "
                         "15.5 ≈ an untrained one)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per setting, interleaved (after the warm-up)")
    ap.add_argument("--matmul-size", type=int, default=4096)
    ap.add_argument("--peer-repo", default=None,
                    help="self-critical.pytorch checkout with its cider submodule (default: $SCP_REPO, then the "
                         "project's copy of 4c48a33)")
    ap.add_argument("--no-reference", action="store_true", help="skip the slow reference steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--sample-modes", action="store_true",
                    help="also time m=5 with --sample-mode eval (off-policy sampling) to price on-policy sampling")
    args = ap.parse_args()
    args.ms = [int(x) for x in args.ms.split(",")]
    args.precision = [p for p in args.precision.split(",") if p]
    return args


def check_or_stop(model: Att2in, ref: peer.Peer, cider: TrainCider, batch: Batch, refs: list[np.ndarray]) -> dict:
    """``check_same_numbers``; SystemExit when rdpp and the peer disagree."""
    check = check_same_numbers(model, ref, cider, batch, refs)
    bad = [k for k in ("q", "kernel", "dpp_weights", "scst_advantage", "scst_inlined_vs_losswrapper")
           if not check[k] <= 1e-9]
    if bad or not check["same_greedy_captions"] or not check["greedy_logprob"] <= 1e-4:
        raise SystemExit(f"rdpp and the reference disagree: {check}")
    return check


def build_sides(args, model, opt, batch, refs, cider, ref: peer.Peer | None) -> tuple[dict, dict]:
    """The timed settings: rdpp's SCST and R-DPP steps for each M and precision (and eval-mode
    sampling with ``--sample-modes``), the peer's SCST step and the published R-DPP step; and
    each setting's (side, reward, M, precision)."""
    sides, labels = {}, {}

    def add(name, label, **kw):
        st = RewardStep(data=None, cider=cider, max_len=MAX_LEN, seed=0, **kw)
        sides[name] = lambda: rdpp_step(st, model, opt, batch, refs, label[3])
        labels[name] = label

    for M in args.ms:
        for prec in args.precision:
            for reward in ("scst", "dpp"):
                add(f"rdpp {reward} m={M} {prec}", ("rdpp", reward, M, prec), reward=reward, m=M)
    if args.sample_modes and 5 in args.ms:  # what on-policy sampling costs: the same steps sampled in eval mode
        for reward in ("scst", "dpp"):
            add(f"rdpp {reward} m=5 fp32 eval-mode sampling", ("rdpp eval-mode", reward, 5, "fp32"), reward=reward,
                m=5, sample_mode="eval")
    if ref is not None:
        synced = lambda: sync(batch.att.device)  # noqa: E731
        sides[PEER_SCST] = lambda: ref.scst_step(batch.fc, batch.att, refs, synced)
        labels[PEER_SCST] = ("peer", "scst", 5, "fp32")
        sides[PUBLISHED] = lambda: ref.dpp_step(batch.fc, batch.att, refs, 5, synced)
        labels[PUBLISHED] = ("published", "dpp", 5, "fp32")
    return sides, labels


def ratios_of(rows: dict, args) -> dict[str, float]:
    """The ratios of medians the tables quote: R-DPP over SCST, bf16's speed-up, against the peer,
    the price of on-policy sampling."""
    out, total = {}, (lambda name: rows[name]["total"])
    for prec in args.precision:
        for M in args.ms:
            out[f"dpp_over_scst_m{M}_{prec}"] = total(f"rdpp dpp m={M} {prec}") / total(f"rdpp scst m={M} {prec}")
    if "fp32" in args.precision and "bf16" in args.precision:
        for M in args.ms:
            for reward in ("scst", "dpp"):
                out[f"{reward}_m{M}_bf16_speedup"] = total(f"rdpp {reward} m={M} fp32") / total(f"rdpp {reward} m={M} bf16")
    if 5 in args.ms and not args.no_reference:
        for prec in args.precision:
            out[f"scst_m5_{prec}_vs_peer"] = total(PEER_SCST) / total(f"rdpp scst m=5 {prec}")
            out[f"dpp_m5_{prec}_vs_published"] = total(PUBLISHED) / total(f"rdpp dpp m=5 {prec}")
    if args.sample_modes and 5 in args.ms:
        for reward in ("scst", "dpp"):
            out[f"{reward}_m5_on_policy_cost"] = (total(f"rdpp {reward} m=5 fp32")
                                                  / total(f"rdpp {reward} m=5 fp32 eval-mode sampling"))
    return out


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    train_refs = make_refs(rng, 2000)  # a "training set" of 2,000 images; the df counts their EOS
    cider = TrainCider(doc_freq_with_eos([[r[r > 0].tolist() for r in img] for img in train_refs], eos_id(VOCAB)),
                       eos_id(VOCAB), MAX_LEN)
    refs = make_refs(rng, args.batch)
    batch = make_batch(args.batch, device=device)
    model = paper_model(words=args.words, device=device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)  # tiny steps: the shapes of the captions stay put
    ref = None
    if not args.no_reference:
        ref = peer.Peer(peer.modules(peer.find_repo(args.peer_repo)), model, lr=1e-6)
        ref.init_reward(train_refs, peer.workdir())
    check = None if ref is None else check_or_stop(model, ref, cider, batch, refs)
    sides, labels = build_sides(args, model, opt, batch, refs, cider, ref)
    t, mm, load = steps_on_roofline(sides, args.repeats, device, args.precision, args.matmul_size)
    rate = {p: v["median"] for p, v in mm.items()}
    results: dict = {"setting": dict(batch=args.batch, vocab=VOCAB, att=f"{REGIONS}x{ATT_DIM}", preset="paper",
                                     max_len=MAX_LEN, device=args.device, target_words=args.words,
                                     repeats=args.repeats),
                     "machine": machine_info(), "load_average_start_end": load, "check": check,
                     "peer_repo": str(ref.mods.repo) if ref is not None else None,
                     "matmul_gflops": mm, "steps": {}}
    for name, o in t.items():
        s = summarise(o)
        s.update(gflop=o["gflop"], gflops=o["gflop"] / s["total"],
                 matmul_fraction=o["gflop"] / s["total"] / rate[labels[name][3]], images_per_s=args.batch / s["total"])
        results["steps"][name] = s
    results["ratios"] = ratios_of(results["steps"], args)
    report(results, args)
    if args.json:
        print(json.dumps(results))


def report(results: dict, args) -> None:
    m = results["machine"]
    where = m["gpu"] if args.device.startswith("cuda") else f"{m['machine']}; {m['threads']} threads"
    print(f"RL fine-tuning step, paper preset, batch {args.batch} images, {where}; seconds, medians of "
          f"{args.repeats} interleaved runs per setting; captions set to {args.words:g} words on average")
    head = (f"{'step':<40}{'words':>6}{'decode':>9}{'reward':>9}{'backward':>9}{'total':>9}{'best':>9}"
            f"{'images/s':>9}{'GFLOP':>7}{'of matmul':>10}{'peak MiB':>9}")
    print(head)
    for name, s in results["steps"].items():
        print(f"{name:<40}{s['words']:>6.1f}{s['decode']:>9.4f}{s['reward']:>9.4f}{s['backward']:>9.4f}"
              f"{s['total']:>9.4f}{s['best']:>9.4f}{s['images_per_s']:>9.1f}{s['gflop']:>7.0f}"
              f"{100 * s['matmul_fraction']:>9.1f}%{s['peak_mib']:>9,.0f}")
    mm = results["matmul_gflops"]
    print("matmul rate (" + f"{args.matmul_size}² torch.mm): " + ", ".join(f"{p} {v['median']:.0f} GFLOP/s" for p, v in mm.items()))
    r = results["ratios"]
    print("ratios of medians:")
    for k, v in r.items():
        print(f"  {k}: {v:.2f}")
    if results["check"]:
        c = results["check"]
        print(f"checked first: rdpp and the reference agree on q ({c['q']:.1e}), the kernel ({c['kernel']:.1e}), "
              f"the R-DPP weights ({c['dpp_weights']:.1e}), the SCST advantages ({c['scst_advantage']:.1e}); "
              f"same greedy captions, log-probs within {c['greedy_logprob']:.1e}; the inlined SCST branch and the "
              f"peer's LossWrapper give the same loss ({c['scst_inlined_vs_losswrapper']:.1e}); peer: {results['peer_repo']}")
    la = results["load_average_start_end"]
    print(f"load average {la[0]:.2f} at the start, {la[1]:.2f} at the end; OMP_WAIT_POLICY={m['omp_wait_policy']}")


if __name__ == "__main__":
    main()
