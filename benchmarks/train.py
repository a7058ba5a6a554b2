"""Speed of one cross-entropy training step at the paper's shapes, against self-critical.pytorch.

Shapes (the paper preset, COCO's sizes): Att2in 512/512/512 with dropout 0.5, vocabulary of 9,487
words (9,488 logits), 14×14 = 196 att regions of 2,048 features, 5 captions of 16 words per image,
a batch of 50 images. A step is what ``rdpp train-xe`` runs per batch (``training.xe.xe_loss``):
teacher-forced forward, the masked token NLL, backward, clipping by value 0.1 and an Adam step.

The reference is self-critical.pytorch's Att2in2 step as it runs there, re-implemented below
(``RefAtt2in2``) with the same parameters: the loader hands over the att features copied once per
caption (B·5 rows), so the att embedding, the attention keys and the attention itself are computed
per caption; each time step runs the Attention module, the Att2in2 core, the output layer and its
log-softmax, and writes into a preallocated output; ``LanguageModelCriterion`` on labels with BOS
and EOS columns. Both models get the same weights and the same batch, and the benchmark checks that
their losses agree (dropout off for that check) before timing.

    python benchmarks/train.py [--json] [--threads 2] [--batch 50] [--steps 3] [--device cpu,cuda] [--profile]

Target (issue 4): ≥ 10.5 images/s on this machine's CPU with 2 threads, twice the reference.

OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE`` unless set): on a shared 2-core machine,
spinning threads made every step 10-20× slower. The JSON line records the policy and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from rdpp_cli.data.loader import Batch
from rdpp_cli.models.att2in import Att2in, config_from_preset
from rdpp_cli.training.xe import xe_loss

VOCAB, REGIONS, ATT_DIM, SEQ_LEN, SEQ_PER_IMG = 9487, 196, 2048, 16, 5


# ----------------------------------------------------------------------------------------------
# the reference: self-critical.pytorch's Att2in2Model (models/AttModel.py) and its XE step
# ----------------------------------------------------------------------------------------------

class RefAttention(nn.Module):
    def __init__(self, rnn_size, att_hid_size):
        super().__init__()
        self.rnn_size, self.att_hid_size = rnn_size, att_hid_size
        self.h2att = nn.Linear(rnn_size, att_hid_size)
        self.alpha_net = nn.Linear(att_hid_size, 1)

    def forward(self, h, att_feats, p_att_feats, att_masks=None):
        att_size = att_feats.numel() // att_feats.size(0) // att_feats.size(-1)
        att = p_att_feats.view(-1, att_size, self.att_hid_size)
        att_h = self.h2att(h)
        att_h = att_h.unsqueeze(1).expand_as(att)
        dot = att + att_h
        dot = torch.tanh(dot)
        dot = dot.view(-1, self.att_hid_size)
        dot = self.alpha_net(dot)
        dot = dot.view(-1, att_size)
        weight = F.softmax(dot, dim=1)
        if att_masks is not None:
            weight = weight * att_masks.view(-1, att_size).float()
            weight = weight / weight.sum(1, keepdim=True)
        att_feats_ = att_feats.view(-1, att_size, att_feats.size(-1))
        return torch.bmm(weight.unsqueeze(1), att_feats_).squeeze(1)


class RefAtt2in2Core(nn.Module):
    def __init__(self, input_encoding_size, rnn_size, att_hid_size, drop_prob_lm):
        super().__init__()
        self.rnn_size = rnn_size
        self.a2c = nn.Linear(rnn_size, 2 * rnn_size)
        self.i2h = nn.Linear(input_encoding_size, 5 * rnn_size)
        self.h2h = nn.Linear(rnn_size, 5 * rnn_size)
        self.dropout = nn.Dropout(drop_prob_lm)
        self.attention = RefAttention(rnn_size, att_hid_size)

    def forward(self, xt, fc_feats, att_feats, p_att_feats, state, att_masks=None):
        att_res = self.attention(state[0][-1], att_feats, p_att_feats, att_masks)
        all_input_sums = self.i2h(xt) + self.h2h(state[0][-1])
        sigmoid_chunk = torch.sigmoid(all_input_sums.narrow(1, 0, 3 * self.rnn_size))
        in_gate = sigmoid_chunk.narrow(1, 0, self.rnn_size)
        forget_gate = sigmoid_chunk.narrow(1, self.rnn_size, self.rnn_size)
        out_gate = sigmoid_chunk.narrow(1, self.rnn_size * 2, self.rnn_size)
        in_transform = all_input_sums.narrow(1, 3 * self.rnn_size, 2 * self.rnn_size) + self.a2c(att_res)
        in_transform = torch.max(in_transform.narrow(1, 0, self.rnn_size),
                                 in_transform.narrow(1, self.rnn_size, self.rnn_size))
        next_c = forget_gate * state[1][-1] + in_gate * in_transform
        next_h = out_gate * torch.tanh(next_c)
        output = self.dropout(next_h)
        return output, (next_h.unsqueeze(0), next_c.unsqueeze(0))


class RefAtt2in2(nn.Module):
    def __init__(self, vocab_size, input_encoding_size, rnn_size, att_hid_size, att_feat_size, drop_prob_lm):
        super().__init__()
        self.vocab_size, self.rnn_size = vocab_size, rnn_size
        self.embed = nn.Sequential(nn.Embedding(vocab_size + 1, input_encoding_size), nn.ReLU(),
                                   nn.Dropout(drop_prob_lm))
        self.fc_embed = lambda x: x  # Att2in2Model
        self.att_embed = nn.Sequential(nn.Linear(att_feat_size, rnn_size), nn.ReLU(), nn.Dropout(drop_prob_lm))
        self.ctx2att = nn.Linear(rnn_size, att_hid_size)
        self.logit = nn.Linear(rnn_size, vocab_size + 1)
        self.core = RefAtt2in2Core(input_encoding_size, rnn_size, att_hid_size, drop_prob_lm)

    def init_hidden(self, bsz):
        w = self.logit.weight
        return (w.new_zeros(1, bsz, self.rnn_size), w.new_zeros(1, bsz, self.rnn_size))

    def _prepare_feature(self, fc_feats, att_feats, att_masks):
        fc_feats = self.fc_embed(fc_feats)
        att_feats = self.att_embed(att_feats)
        p_att_feats = self.ctx2att(att_feats)
        return fc_feats, att_feats, p_att_feats, att_masks

    def get_logprobs_state(self, it, fc_feats, att_feats, p_att_feats, att_masks, state):
        xt = self.embed(it)
        output, state = self.core(xt, fc_feats, att_feats, p_att_feats, state, att_masks)
        return F.log_softmax(self.logit(output), dim=1), state

    def forward(self, fc_feats, att_feats, seq, att_masks=None):
        batch_size = fc_feats.size(0)  # images × seq_per_img: the loader expanded the features
        state = self.init_hidden(batch_size)
        outputs = fc_feats.new_zeros(batch_size, seq.size(1) - 1, self.vocab_size + 1)
        fc_feats, att_feats, p_att_feats, att_masks = self._prepare_feature(fc_feats, att_feats, att_masks)
        for i in range(seq.size(1) - 1):
            it = seq[:, i].clone()
            if i >= 1 and seq[:, i].sum() == 0:
                break
            output, state = self.get_logprobs_state(it, fc_feats, att_feats, p_att_feats, att_masks, state)
            outputs[:, i] = output
        return outputs


def language_model_criterion(input, target, mask):
    target = target[:, :input.size(1)]
    mask = mask[:, :input.size(1)]
    output = -input.gather(2, target.unsqueeze(2)).squeeze(2) * mask
    return torch.sum(output) / torch.sum(mask)


def ref_inputs(fc, att, labels):
    """What self-critical.pytorch's DataLoader hands the model: features repeated per caption,
    labels with a BOS column and an EOS column, and the mask of words + the EOS."""
    B, n, L = labels.shape
    fc_r = fc.unsqueeze(1).expand(B, n, fc.shape[-1]).reshape(B * n, -1).contiguous()
    att_r = att.unsqueeze(1).expand(B, n, *att.shape[1:]).reshape(B * n, *att.shape[1:]).contiguous()
    lab = torch.zeros(B * n, L + 2, dtype=torch.long, device=labels.device)
    lab[:, 1:L + 1] = labels.reshape(B * n, L)
    nonzero = (lab != 0).sum(1) + 2
    mask = (torch.arange(L + 2, device=labels.device)[None] < nonzero[:, None]).float()
    return fc_r, att_r, lab, mask


def copy_weights(ours: Att2in, ref: RefAtt2in2) -> None:
    s = ours.state_dict()
    ref.load_state_dict({_NAME_MAP[k]: v for k, v in s.items()})


# ----------------------------------------------------------------------------------------------
# measurement
# ----------------------------------------------------------------------------------------------

class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms (CPU). Freed heap memory
    is handed back to the OS first (``malloc_trim``), so that what an earlier step left cached in
    the allocator does not hide this one's peak."""

    def __enter__(self):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        self.base = self.peak = self._rss()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def make_batch(batch: int, device: torch.device, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(batch, REGIONS, ATT_DIM, generator=g).relu_()  # CNN features are ≥ 0
    fc = att.mean(1)
    labels = torch.randint(1, VOCAB + 1, (batch, SEQ_PER_IMG, SEQ_LEN), generator=g)
    return Batch(index=np.arange(batch), fc=fc, att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=batch).to(device)


def ours_step(model, opt, batch):
    loss = xe_loss(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def ref_step(model, opt, inputs):
    fc_r, att_r, lab, mask = inputs
    out = model(fc_r, att_r, lab)
    loss = language_model_criterion(out, lab[:, 1:], mask[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def peak_memory(fn, device: torch.device) -> float:
    """Peak memory (MiB) of one call of fn above what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with PeakRSS() as mem:
        fn()
    return mem.mib


def timed_pair(fns: dict, steps: int, warmup: int, device: torch.device) -> dict[str, float]:
    """Median seconds per call of each fn after warmup calls, the fns interleaved step by step
    (A B A B ...) so that a change in the machine's load hits both alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(steps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            sync()
            times[k].append(time.perf_counter() - t)
    return {k: float(np.median(v)) for k, v in times.items()}


_NAME_MAP = {"embed.weight": "embed.0.weight", "att_embed.weight": "att_embed.0.weight",
             "att_embed.bias": "att_embed.0.bias", "ctx2att.weight": "ctx2att.weight", "ctx2att.bias": "ctx2att.bias",
             "logit.weight": "logit.weight", "logit.bias": "logit.bias",
             **{f"{k}.{p}": f"core.{k}.{p}" for k in ("a2c", "i2h", "h2h") for p in ("weight", "bias")},
             **{f"{k}.{p}": f"core.attention.{k}.{p}" for k in ("h2att", "alpha_net") for p in ("weight", "bias")}}


def check_same_math(ours: Att2in, ref: RefAtt2in2, batch: Batch) -> tuple[float, float]:
    """(|loss difference|, largest relative gradient difference over the parameters), dropout off."""
    ours.eval(), ref.eval()
    a = xe_loss(ours, batch)
    fc_r, att_r, lab, mask = ref_inputs(batch.fc, batch.att, batch.labels)
    b = language_model_criterion(ref(fc_r, att_r, lab), lab[:, 1:], mask[:, 1:])
    a.backward(), b.backward()
    rp = dict(ref.named_parameters())
    worst = 0.0
    for name, p in ours.named_parameters():
        if name == "alpha_net.bias":  # softmax ignores a shift: its gradient is 0 up to rounding
            continue
        q = rp[_NAME_MAP[name]]
        worst = max(worst, float((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)))
    ours.zero_grad(set_to_none=True), ref.zero_grad(set_to_none=True)
    ours.train(), ref.train()
    return abs(float(a.detach()) - float(b.detach())), worst


def bench_device(device: torch.device, args) -> dict:
    torch.manual_seed(0)
    cfg = config_from_preset("paper", vocab_size=VOCAB, fc_feat_size=ATT_DIM, att_feat_size=ATT_DIM,
                             seq_length=SEQ_LEN)
    ours = Att2in(cfg).to(device)
    ref = RefAtt2in2(VOCAB, cfg.input_encoding_size, cfg.rnn_size, cfg.att_hid_size, ATT_DIM,
                     cfg.drop_prob_lm).to(device)
    copy_weights(ours, ref)
    batch = make_batch(args.batch, device)
    diff, grad_diff = check_same_math(ours, ref, batch)
    if diff > 1e-4 or grad_diff > 1e-4:
        raise SystemExit(f"the two implementations disagree: |loss difference| {diff:.3g}, "
                         f"relative gradient difference {grad_diff:.3g}")
    opt_o = torch.optim.Adam(ours.parameters(), lr=4e-4)
    opt_r = torch.optim.Adam(ref.parameters(), lr=4e-4)
    ref_in = ref_inputs(batch.fc, batch.att, batch.labels)
    res = {"device": str(device), "threads": torch.get_num_threads() if device.type == "cpu" else None,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
           "load_average": os.getloadavg()[0],
           "batch_images": args.batch, "loss_abs_diff": diff, "grad_rel_diff": grad_diff}
    steps = {"rdpp": lambda: ours_step(ours, opt_o, batch), "ref": lambda: ref_step(ref, opt_r, ref_in)}
    t = timed_pair(steps, args.steps, args.warmup, device)
    t_o, t_r = t["rdpp"], t["ref"]
    m_o, m_r = peak_memory(steps["rdpp"], device), peak_memory(steps["ref"], device)
    res.update({
        "rdpp_s_per_step": t_o, "rdpp_steps_per_s": 1 / t_o, "rdpp_images_per_s": args.batch / t_o,
        "rdpp_peak_mib": m_o,
        "ref_s_per_step": t_r, "ref_steps_per_s": 1 / t_r, "ref_images_per_s": args.batch / t_r,
        "ref_peak_mib": m_r,
        "speedup": t_r / t_o,
    })
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        for name, fn in (("rdpp", lambda: ours_step(ours, opt_o, batch)), ("reference", lambda: ref_step(ref, opt_r, ref_in))):
            with profile(activities=acts) as prof:
                fn()
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(f"\n== torch.profiler: one {name} step on {device} (top ops by self time) ==")
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile_rows))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--batch", type=int, default=50, help="images per step")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per implementation, interleaved (median reported)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cpu,cuda", help="comma-separated; cuda is skipped when absent")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of one step each")
    ap.add_argument("--profile-rows", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for name in args.device.split(","):
        if name == "cuda" and not torch.cuda.is_available():
            continue
        results.append(bench_device(torch.device(name), args))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"XE training step, paper preset (V={VOCAB}, {REGIONS}×{ATT_DIM} att, "
                        f"{SEQ_PER_IMG}×{SEQ_LEN} tokens per image, {args.batch} images)")
    for col in ("device", "impl", "s/step", "steps/s", "images/s", "peak MiB", "speedup"):
        table.add_column(col, justify="right")
    for r in results:
        dev = r["device"] + (f" ({r['threads']} threads)" if r["threads"] else "")
        table.add_row(dev, "rdpp", f"{r['rdpp_s_per_step']:.3f}", f"{r['rdpp_steps_per_s']:.3f}",
                      f"{r['rdpp_images_per_s']:.1f}", f"{r['rdpp_peak_mib']:.0f}", f"{r['speedup']:.2f}×")
        table.add_row(dev, "self-critical (ref)", f"{r['ref_s_per_step']:.3f}", f"{r['ref_steps_per_s']:.3f}",
                      f"{r['ref_images_per_s']:.1f}", f"{r['ref_peak_mib']:.0f}", "1.00×")
    Console().print(table)
    if args.json:
        print(json.dumps({"benchmark": "train_xe", "results": results}))


if __name__ == "__main__":
    main()
