"""Step time of RL fine-tuning (SCST and R-DPP) at the paper's shapes, split into decode / reward / backward.

Shapes (the paper preset): Att2in 512/512/512, vocabulary 9,487 words, 14×14×2048 att features,
a batch of 50 images, captions of up to 16 words; a random model whose EOS bias gives captions of
about 9 words, and 5 random references per image of 8–12 words. CPU, 2 threads by default.

Each step is exactly what ``rdpp finetune`` runs (``rdpp_cli.training.finetune.RewardStep``):

- decode:   M random samples per image (+ one greedy caption per image for SCST), batched, no grad;
- reward:   CIDEr-D of the samples (and greedy captions) in one call; R-DPP: the pairwise CIDEr-D
            kernel in one call and the batched float64 DPP weights;
- backward: one teacher-forced forward of the samples, the policy-gradient loss, backward, clipping
            and the Adam step.

The reference is a self-critical.pytorch-style SCST step in the same process, on the same weights:
sampling with gradients through the step loop (the log-probs of the sampled words kept from
sampling), the output layer and log-softmax applied step by step, the image features and attention
keys copied for each of the M samples (``repeat_interleave``), and pycocoevalcap's ``CiderScorer``
(pure Python, df of the batch's references) as the reward. For R-DPP it also runs the published
code's way at m = 5: M separate sampling calls, the similarity kernel from M(M+1)/2 CiderScorer
calls, and ``np.linalg.inv`` with the sign cut.

    python benchmarks/finetune.py [--json] [--threads 2] [--batch 50] [--ms 2,3,4,5,6,7] [--repeats 2]

Targets (issue 6): an R-DPP step at most 1.2× an SCST step with the same M; an SCST step (M = 5 plus
the greedy baseline) at ≥ 10 images/s, twice the reference implementation's 5.0 images/s.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

from rdpp_cli.data.loader import Batch
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id
from rdpp_cli.models.att2in import Att2in, config_from_preset
from rdpp_cli.training.finetune import RewardStep

VOCAB, REGIONS, ATT_DIM, MAX_LEN, REFS = 9487, 196, 2048, 16, 5


# ----------------------------------------------------------------------------------------------
# synthetic inputs
# ----------------------------------------------------------------------------------------------

def make_refs(rng: np.random.Generator, n_images: int) -> list[np.ndarray]:
    """5 references per image, 8–12 words drawn from a Zipf-like distribution over the vocabulary."""
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    p /= p.sum()
    out = []
    for _ in range(n_images):
        r = np.zeros((REFS, MAX_LEN), np.int64)
        for k in range(REFS):
            n = rng.integers(8, 13)
            r[k, :n] = rng.choice(VOCAB, size=n, p=p) + 1
        out.append(r)
    return out


def make_model(seed: int = 0) -> Att2in:
    torch.manual_seed(seed)
    model = Att2in(config_from_preset("paper", vocab_size=VOCAB, fc_feat_size=ATT_DIM, att_feat_size=ATT_DIM,
                                      seq_length=MAX_LEN))
    with torch.no_grad():  # P(EOS) ≈ 0.1 per step: captions of about 9 words, as a trained model's
        model.logit.bias[0] = float(np.log(VOCAB / 9.0))
    return model


def make_batch(B: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(B, REGIONS, ATT_DIM, generator=g).relu_()
    return Batch(index=np.arange(B), fc=att.mean(1), att=att, att_mask=None,
                 labels=torch.zeros(B, 1, MAX_LEN, dtype=torch.long), epoch=0, batch=0, global_images=B)


# ----------------------------------------------------------------------------------------------
# rdpp's step, timed in its three parts
# ----------------------------------------------------------------------------------------------

def rdpp_step(step: RewardStep, model: Att2in, opt: torch.optim.Optimizer, batch: Batch,
              refs: list[np.ndarray]) -> dict[str, float]:
    t0 = time.perf_counter()
    model.train()
    d = step.draw(model, batch)
    samples_np = d.samples.cpu().numpy()  # (waits for the GPU, if any)
    t1 = time.perf_counter()
    w, _ = step.weights(samples_np, d.greedy, refs)
    t2 = time.perf_counter()
    loss, _ = step.loss(model, batch, d, w)
    _update(model, opt, loss)
    t3 = time.perf_counter()
    return {"decode": t1 - t0, "reward": t2 - t1, "backward": t3 - t2, "total": t3 - t0}


def _update(model: Att2in, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """Backward, clipping (value 0.1, as rdpp and self-critical.pytorch) and the Adam step; returns
    once the GPU, if any, has finished, so the caller's clock covers the work."""
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if loss.is_cuda:
        torch.cuda.synchronize(loss.device)


# ----------------------------------------------------------------------------------------------
# the reference: a self-critical.pytorch-style step on the same weights
# ----------------------------------------------------------------------------------------------

def ref_sample(model: Att2in, att: torch.Tensor, n: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Captions (B*n, L) and the log-probs of the chosen words (B*n, L), gradients kept, one output
    layer per step, features and keys copied per sample (self-critical.pytorch's _sample)."""
    B = att.shape[0]
    H = model.config.rnn_size
    a = model.dropout(F.relu(model.att_embed(att)))
    p = model.ctx2att(a)
    a, p = a.repeat_interleave(n, 0), p.repeat_interleave(n, 0)  # (B*n, R, ·) copies
    N = B * n
    h = att.new_zeros(N, H)
    c = att.new_zeros(N, H)
    it = torch.zeros(N, dtype=torch.long, device=att.device)
    seqs, logps = [], []
    unfinished = torch.ones(N, dtype=torch.bool, device=att.device)
    for t in range(MAX_LEN):
        x = model.dropout(F.relu(model.embed(it)))
        att_h = model.h2att(h)
        dot = torch.tanh(p + att_h.unsqueeze(1))
        weight = F.softmax(model.alpha_net(dot).squeeze(-1), dim=1)
        z = torch.bmm(weight.unsqueeze(1), a).squeeze(1)
        s = model.i2h(x) + model.h2h(h)
        gates = torch.sigmoid(s[:, :3 * H])
        ig, fg, og = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:]
        g = s[:, 3 * H:] + model.a2c(z)
        g = torch.maximum(g[:, :H], g[:, H:])
        c = fg * c + ig * g
        h = og * torch.tanh(c)
        lp = F.log_softmax(model.logit(model.dropout(h)), dim=1)
        if greedy:
            it = lp.argmax(1)
        else:
            it = torch.multinomial(lp.detach().exp(), 1).squeeze(1)
        chosen = lp.gather(1, it.unsqueeze(1)).squeeze(1)
        it = it * unfinished
        seqs.append(it)
        logps.append(chosen)
        unfinished = unfinished & (it > 0)
        if not bool(unfinished.any()):
            break
    return torch.stack(seqs, 1), torch.stack(logps, 1)


def _to_str(row: np.ndarray) -> str:
    out = []
    for t in row:
        if t == 0:
            break
        out.append(str(int(t)))
    return " ".join(out)


def ref_cider(hyps: np.ndarray, refs: list[list[str]], ref_index: np.ndarray) -> np.ndarray:
    """pycocoevalcap's pure-Python CiderScorer on the batch (df from the references scored)."""
    from pycocoevalcap.cider.cider_scorer import CiderScorer

    scorer = CiderScorer(n=4, sigma=6.0)
    for h, i in zip(hyps, ref_index):
        scorer += (_to_str(h), refs[i])
    _, scores = scorer.compute_score()
    return np.asarray(scores)


def ref_scst_step(model: Att2in, opt, batch: Batch, refs_str: list[list[str]], M: int) -> dict[str, float]:
    B = batch.size
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        greedy, _ = ref_sample(model, batch.att, 1, greedy=True)
    model.train()
    seqs, logps = ref_sample(model, batch.att, M, greedy=False)
    t1 = time.perf_counter()
    T = max(seqs.shape[1], greedy.shape[1])
    hyps = np.concatenate([F.pad(seqs, (0, T - seqs.shape[1])).cpu().numpy(),
                           F.pad(greedy, (0, T - greedy.shape[1])).cpu().numpy()])
    scores = ref_cider(hyps, refs_str, np.concatenate([np.repeat(np.arange(B), M), np.arange(B)]))
    reward = torch.from_numpy(scores[:B * M] - np.repeat(scores[B * M:], M)).float().to(seqs.device)
    t2 = time.perf_counter()
    mask = torch.cat([seqs.new_ones(B * M, 1).float(), (seqs > 0).float()[:, :-1]], 1)
    loss = -(logps * reward.unsqueeze(1) * mask).sum() / mask.sum()
    _update(model, opt, loss)
    t3 = time.perf_counter()
    return {"decode": t1 - t0, "reward": t2 - t1, "backward": t3 - t2, "total": t3 - t0}


def ref_dpp_step(model: Att2in, opt, batch: Batch, refs_str: list[list[str]], M: int) -> dict[str, float]:
    """The published R-DPP code's step: M sampling calls, M(M+1)/2 pairwise CiderScorer calls, np.linalg.inv."""
    B = batch.size
    t0 = time.perf_counter()
    model.train()
    draws = [ref_sample(model, batch.att, 1, greedy=False) for _ in range(M)]
    t1 = time.perf_counter()
    caps = [d[0].cpu().numpy() for d in draws]
    q = np.stack([ref_cider(c, refs_str, np.arange(B)) for c in caps], 1)
    S = np.zeros((B, M, M))
    for i in range(M):
        as_ref = [[_to_str(r)] for r in caps[i]]
        for j in range(i, M):
            S[:, i, j] = S[:, j, i] = ref_cider(caps[j], as_ref, np.arange(B))
    L = S * q[:, :, None] * q[:, None, :]
    Linv = np.linalg.inv(L + 1e-10 * np.eye(M)[None])
    w = (np.sign(Linv) * L).sum(-1) / M
    t2 = time.perf_counter()
    loss = 0.0
    for i, (seqs, logps) in enumerate(draws):
        mask = torch.cat([seqs.new_ones(B, 1).float(), (seqs > 0).float()[:, :-1]], 1)
        wi = torch.from_numpy(w[:, i]).float().to(seqs.device)
        loss = loss + (-(logps * wi.unsqueeze(1) * mask)).sum() / mask.sum()
    _update(model, opt, loss / M)
    t3 = time.perf_counter()
    return {"decode": t1 - t0, "reward": t2 - t1, "backward": t3 - t2, "total": t3 - t0}


# ----------------------------------------------------------------------------------------------

def best_of(fn, repeats: int) -> dict[str, float]:
    """Run once to warm up, then ``repeats`` times; keep the run with the smallest total."""
    fn()
    runs = [fn() for _ in range(repeats)]
    return min(runs, key=lambda r: r["total"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=50, help="images per step")
    ap.add_argument("--ms", default="2,3,4,5,6,7", help="samples per image to time")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per setting (after one warm-up)")
    ap.add_argument("--no-reference", action="store_true", help="skip the slow reference steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--sample-modes", action="store_true",
                    help="also time m=5 with --sample-mode eval (off-policy sampling) to price on-policy sampling")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    ms = [int(x) for x in args.ms.split(",")]

    rng = np.random.default_rng(0)
    train_refs = make_refs(rng, 2000)  # a "training set" of 2,000 images; the df counts their EOS
    df = doc_freq_with_eos([[r[r > 0].tolist() for r in img] for img in train_refs], eos_id(VOCAB))
    cider = TrainCider(df, eos_id(VOCAB), MAX_LEN)
    refs = make_refs(rng, args.batch)
    refs_str = [[_to_str(r) for r in rs] for rs in refs]
    batch = make_batch(args.batch).to(device)
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)  # tiny steps: the shapes of the captions stay put

    results: dict = OrderedDict(setting=dict(threads=args.threads, batch=args.batch, vocab=VOCAB,
                                             att=f"{REGIONS}x{ATT_DIM}", preset="paper", max_len=MAX_LEN, device=args.device))
    where = f"CPU {args.threads} threads" if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"RL fine-tuning step, paper preset, batch {args.batch} images, {where} "
          "(seconds; best of runs)")
    print(f"{'step':<16}{'m':>3}{'decode':>9}{'reward':>9}{'backward':>10}{'total':>9}{'images/s':>10}", flush=True)

    def show(name: str, M: int, r: dict) -> None:
        print(f"{name:<16}{M:>3}{r['decode']:>9.3f}{r['reward']:>9.3f}{r['backward']:>10.3f}{r['total']:>9.3f}"
              f"{args.batch / r['total']:>10.1f}", flush=True)

    for M in ms:
        for reward in ("scst", "dpp"):
            step = RewardStep(data=None, cider=cider, reward=reward, m=M, max_len=MAX_LEN, seed=0)
            r = best_of(lambda: rdpp_step(step, model, opt, batch, refs), args.repeats)
            results[f"{reward}_m{M}"] = r
            show(f"rdpp {reward}", M, r)
        results[f"dpp_over_scst_m{M}"] = results[f"dpp_m{M}"]["total"] / results[f"scst_m{M}"]["total"]
    if args.sample_modes and 5 in ms:  # what on-policy sampling costs: the same steps sampled in eval mode
        for reward in ("scst", "dpp"):
            step = RewardStep(data=None, cider=cider, reward=reward, m=5, max_len=MAX_LEN, seed=0, sample_mode="eval")
            r = best_of(lambda: rdpp_step(step, model, opt, batch, refs), args.repeats)
            results[f"{reward}_m5_eval_sampling"] = r
            show(f"{reward} eval-mode", 5, r)
            results[f"{reward}_m5_on_policy_cost"] = results[f"{reward}_m5"]["total"] / r["total"]
    if not args.no_reference:
        r = best_of(lambda: ref_scst_step(model, opt, batch, refs_str, 5), max(1, args.repeats - 1))
        results["reference_scst_m5"] = r
        show("reference scst", 5, r)
        r = best_of(lambda: ref_dpp_step(model, opt, batch, refs_str, 5), max(1, args.repeats - 1))
        results["reference_dpp_m5"] = r
        show("reference dpp", 5, r)
    print()
    for M in ms:
        print(f"m={M}: R-DPP step / SCST step = {results[f'dpp_over_scst_m{M}']:.2f}  (target ≤ 1.2)")
    for reward in ("scst", "dpp"):
        if f"{reward}_m5_on_policy_cost" in results:
            print(f"{reward} m=5: on-policy step / eval-mode-sampling step = {results[f'{reward}_m5_on_policy_cost']:.2f}")
    if "scst_m5" in results:
        ips = args.batch / results["scst_m5"]["total"]
        results["scst_m5_images_per_s"] = ips
        line = f"SCST (m=5 + greedy): {ips:.1f} images/s (target ≥ 10)"
        if "reference_scst_m5" in results:
            ref_ips = args.batch / results["reference_scst_m5"]["total"]
            results["reference_scst_m5_images_per_s"] = ref_ips
            results["speedup_scst_vs_reference"] = ips / ref_ips
            line += f"; reference {ref_ips:.1f} images/s; speed-up {ips / ref_ips:.2f}x"
        print(line)
    if "dpp_m5" in results and "reference_dpp_m5" in results:
        results["speedup_dpp_vs_reference"] = results["reference_dpp_m5"]["total"] / results["dpp_m5"]["total"]
        print(f"R-DPP (m=5): {args.batch / results['dpp_m5']['total']:.1f} images/s; published-code style "
              f"{args.batch / results['reference_dpp_m5']['total']:.1f} images/s; "
              f"speed-up {results['speedup_dpp_vs_reference']:.2f}x")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
