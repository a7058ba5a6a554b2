"""Speed of one cross-entropy training step at the paper's shapes: rdpp in fp32 and bf16, against
self-critical.pytorch's code path as it is today.

Shapes (the paper preset, COCO's sizes): Att2in 512/512/512 with dropout 0.5, vocabulary of 9,487
words (9,488 logits), 14×14 = 196 att regions of 2,048 features, 5 captions per image of
``--words`` words (16 by default, the label width: every caption full; ``8-16`` draws each
caption's length uniformly), a batch of 50 images. A step is what ``rdpp train-xe`` runs per batch
(``training.xe.xe_loss`` under ``--precision``'s autocast, then backward, clipping by value 0.1
and an Adam step).

The reference ("upstream") is self-critical.pytorch today (benchmarks/upstream.py: its
``Att2in2Model`` in ``captioning/models/AttModel.py``): ``_prepare_feature`` embeds the att
features and projects the attention keys once per image, ``repeat_tensors`` copies them for each of
the 5 captions, the core, the output layer and its log-softmax run step by step into a
preallocated output, ``LanguageModelCriterion`` on labels with BOS and EOS columns; float32 (its
training script has no mixed precision). All sides start from the same weights (separate copies,
each with its own Adam) and get the same batch. Before timing, the script checks that rdpp and the
reference compute the same loss and gradients (in float64, dropout off, on 8 of the images), and reports how far rdpp's
bf16 loss is from its fp32 loss on the same batch.

Timing (benchmarks/timing.py ``steps``): one warm-up call per side (its matrix-product FLOPs
counted with torch.utils.flop_counter), one untimed call for its peak memory, then ``--steps``
calls per side, interleaved (the order reversed every other round); medians (best beside); the matmul rate of this device in fp32 and bf16 measured in the same run
(before and after the steps, median of both), so each step's achieved GFLOP/s is also shown as a
fraction of that roofline.

    python benchmarks/train.py [--precision fp32,bf16] [--steps 3] [--batch 50] [--words 16] [--threads 2]
                               [--device cpu,cuda] [--matmul-size 4096] [--no-reference] [--json] [--profile]

OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE`` unless set): on a shared 2-core machine,
spinning threads made every step 10-20× slower. The JSON line records the policy and the load.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream  # noqa: E402
from timing import machine_info, steps_on_roofline  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.models.att2in import Att2in, config_from_preset  # noqa: E402
from rdpp_cli.precision import autocast  # noqa: E402
from rdpp_cli.training.xe import xe_loss  # noqa: E402

VOCAB, REGIONS, ATT_DIM, SEQ_LEN, SEQ_PER_IMG = 9487, 196, 2048, 16, 5
REF = "upstream fp32"


def parse_words(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition("-")
    lo, hi = int(lo), int(hi or lo)
    if not 1 <= lo <= hi <= SEQ_LEN:
        raise SystemExit(f"--words {s}: give N or MIN-MAX with 1 ≤ MIN ≤ MAX ≤ {SEQ_LEN}")
    return lo, hi


def make_batch(batch: int, words: tuple[int, int], device: torch.device, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(batch, REGIONS, ATT_DIM, generator=g).relu_()  # CNN features are ≥ 0
    fc = att.mean(1)
    labels = torch.randint(1, VOCAB + 1, (batch, SEQ_PER_IMG, SEQ_LEN), generator=g)
    n = torch.randint(words[0], words[1] + 1, (batch, SEQ_PER_IMG, 1), generator=g)
    labels = labels * (torch.arange(SEQ_LEN) < n)
    return Batch(index=np.arange(batch), fc=fc, att=att, att_mask=None, labels=labels, epoch=0, batch=0,
                 global_images=batch).to(device)


def rdpp_step(model: Att2in, opt, batch: Batch, precision: str) -> float:
    with autocast(precision, batch.att.device):
        loss = xe_loss(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def upstream_loss(model: upstream.Att2in2, fc, att, labels, masks) -> torch.Tensor:
    """``LossWrapper`` without self-critical: ``crit(model(fc, att, labels[..., :-1]), labels[..., 1:], masks[..., 1:])``."""
    return upstream.language_model_criterion(model._forward(fc, att, labels[..., :-1]), labels[..., 1:],
                                             masks[..., 1:])


def upstream_step(model: upstream.Att2in2, opt, fc, att, labels, masks) -> float:
    opt.zero_grad()
    loss = upstream_loss(model, fc, att, labels, masks)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    return float(loss.detach())


def check_same_math(base: Att2in, batch: Batch, images: int = 8) -> dict[str, float]:
    """rdpp against the reference on the batch's first ``images`` images, in float64 and dropout off
    (so float rounding cannot hide a difference): |loss difference| and the largest relative
    gradient difference; and rdpp's bf16 loss against its fp32 loss on the whole batch."""
    ours = copy.deepcopy(base).double().eval()
    ref = upstream.from_rdpp(ours).eval()
    small = Batch(**{**batch.__dict__, "fc": batch.fc[:images].double(), "att": batch.att[:images].double(),
                     "labels": batch.labels[:images], "index": batch.index[:images]})
    a = xe_loss(ours, small)
    b = upstream_loss(ref, small.fc, small.att, *upstream.xe_labels(small.labels))
    a.backward(), b.backward()
    rp = dict(ref.named_parameters())
    worst = 0.0
    for name, p in ours.named_parameters():
        if name == "alpha_net.bias":  # softmax ignores a shift: its gradient is 0 up to rounding
            continue
        q = rp[upstream.RDPP_TO_UPSTREAM[name]]
        worst = max(worst, float((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)))
    base.eval()
    with torch.no_grad():
        fp32 = float(xe_loss(base, batch))
        with autocast("bf16", batch.att.device):
            bf16 = float(xe_loss(base, batch))
    base.train()
    return {"loss_abs_diff": abs(float(a.detach()) - float(b.detach())), "grad_rel_diff": worst,
            "bf16_loss_rel_diff": abs(bf16 - fp32) / fp32}


def bench_device(device: torch.device, args) -> dict:
    torch.manual_seed(0)
    cfg = config_from_preset("paper", vocab_size=VOCAB, att_feat_size=ATT_DIM, seq_length=SEQ_LEN)
    base = Att2in(cfg).to(device)
    batch = make_batch(args.batch, args.words, device)
    ref_in = (batch.fc, batch.att, *upstream.xe_labels(batch.labels))
    ref = upstream.from_rdpp(base)
    check = check_same_math(base, batch)
    if check["loss_abs_diff"] > 1e-9 or check["grad_rel_diff"] > 1e-9:
        raise SystemExit(f"rdpp and the reference disagree: {check}")

    sides, models = {}, {}
    for prec in args.precision:
        m = Att2in(cfg).to(device)
        m.load_state_dict(base.state_dict())
        opt = torch.optim.Adam(m.parameters(), lr=4e-4)
        models[f"rdpp {prec}"] = m
        sides[f"rdpp {prec}"] = lambda m=m, opt=opt, prec=prec: rdpp_step(m, opt, batch, prec)
    if not args.no_reference:
        opt_r = torch.optim.Adam(ref.parameters(), lr=4e-4)
        sides[REF] = lambda: upstream_step(ref, opt_r, *ref_in)

    t, mm, load = steps_on_roofline(sides, args.steps, device, args.precision, args.matmul_size)
    rate = {p: v["median"] for p, v in mm.items()}
    words = (batch.labels > 0).sum(-1).float().mean().item()
    res = {"device": str(device), **machine_info(), "load_average_start_end": load, "batch_images": args.batch,
           "words_per_caption": words, "steps": args.steps, **check,
           "matmul_gflops": mm, "sides": {}}
    for name, o in t.items():
        prec = name.split()[-1]
        achieved = o["gflop"] / o["median"]
        res["sides"][name] = {
            "s_per_step": o["median"], "best_s": o["best"], "times": o["times"], "images_per_s": args.batch / o["median"],
            "gflop": o["gflop"], "gflops": achieved, "matmul_fraction": achieved / rate[prec],
            "peak_mib": o["peak_mib"],
            "vs_upstream": t[REF]["median"] / o["median"] if REF in t else None,
        }
    if "rdpp fp32" in t and "rdpp bf16" in t:
        res["bf16_over_fp32"] = t["rdpp fp32"]["median"] / t["rdpp bf16"]["median"]
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        for name, fn in sides.items():
            with profile(activities=acts) as prof:
                fn()
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(f"\n== torch.profiler: one {name} step on {device} (top ops by self time) ==")
            print(prof.key_averages().table(sort_by=key, row_limit=args.profile_rows))
    return res


def print_table(results: list[dict], args) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=150)
    for r in results:
        where = r["gpu"] if r["device"].startswith("cuda") else f"{r['machine']}; {r['threads']} threads"
        table = Table(title=f"XE training step, paper preset (V={VOCAB}, {REGIONS}×{ATT_DIM} att, {SEQ_PER_IMG} captions "
                            f"of {r['words_per_caption']:.1f} words per image, {args.batch} images) on {where}; "
                            f"median of {args.steps} interleaved steps")
        for col in ("side", "s/step", "best", "images/s", "GFLOP", "GFLOP/s", "of matmul rate", "peak MiB",
                    "vs upstream"):
            table.add_column(col, justify="right")
        for name, s in r["sides"].items():
            table.add_row(name, f"{s['s_per_step']:.3f}", f"{s['best_s']:.3f}", f"{s['images_per_s']:.1f}",
                          f"{s['gflop']:.0f}", f"{s['gflops']:.0f}", f"{100 * s['matmul_fraction']:.0f} %",
                          f"{s['peak_mib']:,.0f}", f"{s['vs_upstream']:.2f}×" if s["vs_upstream"] else "-")
        con.print(table)
        mm = r["matmul_gflops"]
        con.print(f"matmul rate ({args.matmul_size}² torch.mm, median of the runs before and after): "
                  + ", ".join(f"{p} {v['median']:.0f} GFLOP/s" for p, v in mm.items()))
        if "bf16_over_fp32" in r:
            con.print(f"rdpp bf16 step / fp32 step: {r['bf16_over_fp32']:.2f}× faster (ratio of medians)")
        con.print(f"checked first: |loss rdpp − upstream| {r['loss_abs_diff']:.1e}, gradients within "
                  f"{r['grad_rel_diff']:.1e} relative (float64); rdpp bf16 loss within {r['bf16_loss_rel_diff']:.1e} "
                  f"relative of fp32 (same batch, dropout off)")
        con.print(f"load average {r['load_average_start_end'][0]:.2f} at the start, {r['load_average_start_end'][1]:.2f} "
                  f"at the end; OMP_WAIT_POLICY={r['omp_wait_policy']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--batch", type=int, default=50, help="images per step")
    ap.add_argument("--words", default=str(SEQ_LEN), help="words per caption: N, or MIN-MAX drawn uniformly")
    ap.add_argument("--precision", default="fp32,bf16", help="rdpp's precisions to time, comma-separated")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side, interleaved (median reported)")
    ap.add_argument("--matmul-size", type=int, default=4096, help="n of the n×n matmul that measures the roofline")
    ap.add_argument("--device", default="cpu,cuda", help="comma-separated; cuda is skipped when absent")
    ap.add_argument("--no-reference", action="store_true", help="time rdpp only")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of one step of each side")
    ap.add_argument("--profile-rows", type=int, default=15)
    args = ap.parse_args()
    args.words = parse_words(args.words)
    args.precision = [p for p in args.precision.split(",") if p]
    if not set(args.precision) <= {"fp32", "bf16", "fp16"}:
        raise SystemExit(f"--precision: fp32, bf16 or fp16 (got {','.join(args.precision)})")
    torch.set_num_threads(args.threads)
    results = [bench_device(torch.device(name), args) for name in args.device.split(",")
               if name != "cuda" or torch.cuda.is_available()]
    print_table(results, args)
    if args.json:
        print(json.dumps({"benchmark": "train_xe", "results": results}))


if __name__ == "__main__":
    main()
