"""Speed of one cross-entropy training step at the paper's shapes: rdpp in fp32 and bf16 against
self-critical.pytorch's own code (the peer), in the same process.

Shapes (the paper preset, COCO's sizes): Att2in 512/512/512 with dropout 0.5, vocabulary of 9,487
words (9,488 logits), 14×14 = 196 att regions of 2,048 features, 5 captions per image of
``--words`` words (16 by default, the label width: every caption full; ``8-16`` draws each
caption's length uniformly, as the peer's own harness does), a batch of ``--batch`` images (50). A
step is what ``rdpp train-xe`` runs per batch (``training.xe.xe_loss`` under ``--precision``'s
autocast, then backward, clipping by value 0.1 and an Adam step).

The reference is the peer's code itself (benchmarks/peer.py: self-critical.pytorch's
``Att2in2Model``, ``LossWrapper`` and optimizer, unmodified, one step as its ``tools/train.py``
runs it), float32 (its training script has no mixed precision), found by ``--peer-repo`` or
``$SCP_REPO``. All sides start from the same weights (separate copies, each with its own Adam)
and get the same batch. Before timing, the script checks in float64 with dropout off, on 8 of the
images, that rdpp and the peer's code compute the same loss and gradients (not with
``--no-reference``); and reports how far rdpp's bf16 loss is from its fp32 loss on the same batch.

Timing (benchmarks/timing.py ``steps``): one warm-up call per side (its matrix-product FLOPs
counted with torch.utils.flop_counter), one untimed call for its peak memory, then ``--steps``
calls per side, interleaved (one of each per round, the order reversed every other round: ABBA);
medians (best beside); the matmul rate of this device in fp32 and bf16 measured in the same run
(before and after the steps, median of both), so each step's achieved GFLOP/s is also shown as a
fraction of that roofline. ``--profile`` adds torch.profiler tables of one step of each side and
an op-by-op comparison of rdpp's fp32 and bf16 steps (where bf16 gains and where it loses).

    python benchmarks/train.py [--precision fp32,bf16] [--steps 3] [--batch 50] [--words 16] [--threads 2]
                               [--device cpu,cuda] [--peer-repo PATH] [--no-reference] [--json] [--profile]

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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402
from common import ATT_DIM, REGIONS, SEQ_LEN, SEQ_PER_IMG, VOCAB, make_batch, paper_model, parse_words  # noqa: E402
from timing import machine_info, steps_on_roofline  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.models.att2in import Att2in  # noqa: E402
from rdpp_cli.precision import BF16_MIN_SPEEDUP, ProbeShape, autocast, choose_precision, probe_cpu_bf16  # noqa: E402
from rdpp_cli.training.xe import xe_loss  # noqa: E402

REF = "self-critical.pytorch fp32"


def peer_inputs(batch: Batch) -> tuple:
    """The batch as the peer's loader gives it: fc, att, labels with BOS/EOS columns, masks, gts."""
    labels, masks = peer.xe_labels(batch.labels)
    return batch.fc, batch.att, labels, masks, [g for g in batch.labels.cpu().numpy()]


def rdpp_step(model: Att2in, opt, batch: Batch, precision: str) -> float:
    with autocast(precision, batch.att.device):
        loss = xe_loss(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _grad_rel_diff(ours: Att2in, named: dict[str, torch.Tensor]) -> float:
    """Largest relative difference between rdpp's gradients and another model's (peer names)."""
    worst = 0.0
    for name, p in ours.named_parameters():
        if name == "alpha_net.bias":  # softmax ignores a shift: its gradient is 0 up to rounding
            continue
        q = named[peer.RDPP_TO_PEER[name]]
        worst = max(worst, float((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30)))
    return worst


def check_same_math(base: Att2in, batch: Batch, mods: peer.Modules | None, images: int = 8) -> dict[str, float]:
    """rdpp against the peer's code on the batch's first ``images`` images, in float64 and dropout
    off (so float rounding cannot hide a difference): |loss difference| and the largest relative
    gradient difference; and rdpp's bf16 loss against its fp32 loss on the whole batch."""
    out = {}
    if mods is not None:
        ours = copy.deepcopy(base).double().eval()
        small = Batch(**{**batch.__dict__, "fc": batch.fc[:images].double(), "att": batch.att[:images].double(),
                         "labels": batch.labels[:images], "index": batch.index[:images]})
        a = xe_loss(ours, small)
        a.backward()
        theirs = peer.Peer(mods, ours)
        theirs.lw.eval()
        c = theirs.xe_loss(*peer_inputs(small))
        c.backward()
        out.update(peer_loss_abs_diff=abs(float(a.detach()) - float(c.detach())),
                   peer_grad_rel_diff=_grad_rel_diff(ours, dict(theirs.model.named_parameters())))
    base.eval()
    with torch.no_grad():
        fp32 = float(xe_loss(base, batch))
        with autocast("bf16", batch.att.device):
            bf16 = float(xe_loss(base, batch))
    base.train()
    out["bf16_loss_rel_diff"] = abs(bf16 - fp32) / fp32
    return out


def build_sides(base: Att2in, batch: Batch, args, mods: peer.Modules | None) -> dict:
    sides = {}
    for prec in args.precision:
        m = copy.deepcopy(base)
        opt = torch.optim.Adam(m.parameters(), lr=4e-4)
        sides[f"rdpp {prec}"] = lambda m=m, opt=opt, prec=prec: rdpp_step(m, opt, batch, prec)
    if mods is not None:
        theirs = peer.Peer(mods, base)  # Adam at lr 4e-4: the peer's default
        inputs = peer_inputs(batch)
        sides[REF] = lambda: theirs.xe_step(*inputs)
    return sides


def bench_device(device: torch.device, args, mods: peer.Modules | None) -> dict:
    base = paper_model(device=device)
    batch = make_batch(args.batch, args.words, device)
    check = check_same_math(base, batch, mods)
    bad = {k: v for k, v in check.items() if k.endswith(("loss_abs_diff", "grad_rel_diff")) and not v <= 1e-9}
    if bad:
        raise SystemExit(f"rdpp and the reference disagree: {check}")
    sides = build_sides(base, batch, args, mods)
    t, mm, load = steps_on_roofline(sides, args.steps, device, args.precision, args.matmul_size)
    rate = {p: v["median"] for p, v in mm.items()}
    words = (batch.labels > 0).sum(-1).float().mean().item()
    res = {"device": str(device), **machine_info(), "load_average_start_end": load, "batch_images": args.batch,
           "words_per_caption": words, "steps": args.steps, **check, "peer_repo": str(mods.repo) if mods else None,
           "matmul_gflops": mm, "sides": {}}
    for name, o in t.items():
        prec = name.split()[-1]
        achieved = o["gflop"] / o["median"]
        res["sides"][name] = {
            "s_per_step": o["median"], "best_s": o["best"], "times": o["times"], "images_per_s": args.batch / o["median"],
            "gflop": o["gflop"], "gflops": achieved, "matmul_fraction": achieved / rate[prec],
            "peak_mib": o["peak_mib"], "vs_peer": t[REF]["median"] / o["median"] if REF in t else None,
        }
    if "rdpp fp32" in t and "rdpp bf16" in t:
        res["bf16_over_fp32"] = t["rdpp fp32"]["median"] / t["rdpp bf16"]["median"]
        if device.type == "cpu":  # what --precision auto's probe says here, beside the step's own ratio
            probe = probe_cpu_bf16(ProbeShape())
            res["auto_probe"] = {**probe, "choice": choose_precision(probe["fp32_s"], probe["bf16_s"])}
    if args.profile:
        res["profile"] = profile_sides(sides, device, args.profile_rows)
    return res


# ----------------------------------------------------------------------------------------------
# --profile: where one step's time goes, and where bf16 gains or loses against fp32
# ----------------------------------------------------------------------------------------------

def _self_us(evt, device: torch.device) -> float:
    return float(evt.self_device_time_total if device.type == "cuda" else evt.self_cpu_time_total)


def profile_sides(sides: dict, device: torch.device, rows: int) -> dict[str, dict[str, float]]:
    """One profiled step of each side (after the timed ones): a table of its top ops by self time
    (grouped by input shapes), then, when rdpp ran in fp32 and bf16, the two side by side per op.
    Returns {side: {op: self ms}}."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    per_op: dict[str, dict[str, float]] = {}
    for name, fn in sides.items():
        with profile(activities=acts, record_shapes=True) as prof:
            fn()
        print(f"\n== torch.profiler: one {name} step on {device} (top ops by self time, by input shapes) ==")
        print(prof.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=rows))
        per_op[name] = {e.key: _self_us(e, device) / 1e3 for e in prof.key_averages()}
    if "rdpp fp32" in per_op and "rdpp bf16" in per_op:
        print(compare_ops(per_op["rdpp fp32"], per_op["rdpp bf16"], rows))
    return per_op


def compare_ops(fp32: dict[str, float], bf16: dict[str, float], rows: int) -> str:
    """A text table of the ops that take the most self time in either precision: fp32 ms, bf16 ms,
    bf16 − fp32 (what bf16 saves is negative, what it adds — casts, slower kernels — positive)."""
    ops = sorted(set(fp32) | set(bf16), key=lambda k: -max(fp32.get(k, 0.0), bf16.get(k, 0.0)))[:rows]
    lines = [f"\n== rdpp's step, self time per op: fp32 against bf16 (ms; top {rows}) ==",
             f"{'op':<44}{'fp32':>10}{'bf16':>10}{'bf16 - fp32':>13}"]
    for k in ops:
        a, b = fp32.get(k, 0.0), bf16.get(k, 0.0)
        lines.append(f"{k[:43]:<44}{a:>10.1f}{b:>10.1f}{b - a:>+13.1f}")
    ta, tb = sum(fp32.values()), sum(bf16.values())
    lines.append(f"{'all ops':<44}{ta:>10.1f}{tb:>10.1f}{tb - ta:>+13.1f}")
    return "\n".join(lines)


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
                    "vs peer"):
            table.add_column(col, justify="right")
        for name, s in r["sides"].items():
            table.add_row(name, f"{s['s_per_step']:.4f}", f"{s['best_s']:.4f}", f"{s['images_per_s']:.1f}",
                          f"{s['gflop']:.0f}", f"{s['gflops']:.0f}", f"{100 * s['matmul_fraction']:.1f} %",
                          f"{s['peak_mib']:,.0f}", f"{s['vs_peer']:.2f}×" if s["vs_peer"] else "-")
        con.print(table)
        mm = r["matmul_gflops"]
        con.print(f"matmul rate ({args.matmul_size}² torch.mm, median of the runs before and after): "
                  + ", ".join(f"{p} {v['median']:.0f} GFLOP/s" for p, v in mm.items()))
        if "bf16_over_fp32" in r:
            con.print(f"rdpp bf16 step / fp32 step: {r['bf16_over_fp32']:.2f}× faster (ratio of medians)")
        if "auto_probe" in r:
            p = r["auto_probe"]
            ratio = f"{p['fp32_s'] / p['bf16_s']:.2f}×" if p["bf16_s"] else "abandoned"
            con.print(f"--precision auto's probe here (rdpp_cli/precision.py, paper widths): fp32 {p['fp32_s']:.3f} s, "
                      f"bf16 {p['bf16_s'] or float('nan'):.3f} s ({ratio}; bf16 needs {BF16_MIN_SPEEDUP:.2f}×) "
                      f"-> {p['choice']}")
        peer_check = (f"checked first (float64, dropout off): rdpp against the peer's code: loss "
                      f"{r['peer_loss_abs_diff']:.1e}, gradients {r['peer_grad_rel_diff']:.1e} relative; "
                      if r.get("peer_loss_abs_diff") is not None else "")
        con.print(f"{peer_check}rdpp bf16 loss within {r['bf16_loss_rel_diff']:.1e} relative of fp32 (same batch)")
        if r["peer_repo"]:
            con.print(f"peer: {r['peer_repo']}")
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
    ap.add_argument("--peer-repo", default=None,
                    help="self-critical.pytorch checkout with its cider submodule (default: $SCP_REPO, then the "
                         "project's copy of 4c48a33)")
    ap.add_argument("--no-reference", action="store_true", help="time rdpp only (no check against the peer)")
    ap.add_argument("--profile", action="store_true",
                    help="print torch.profiler tables of one step of each side, and rdpp's fp32 and bf16 op by op")
    ap.add_argument("--profile-rows", type=int, default=15)
    args = ap.parse_args()
    args.words = parse_words(args.words)
    args.precision = [p for p in args.precision.split(",") if p]
    if not set(args.precision) <= {"fp32", "bf16", "fp16"}:
        raise SystemExit(f"--precision: fp32, bf16 or fp16 (got {','.join(args.precision)})")
    mods = None if args.no_reference else peer.modules(peer.find_repo(args.peer_repo))
    torch.set_num_threads(args.threads)
    results = [bench_device(torch.device(name), args, mods) for name in args.device.split(",")
               if name != "cuda" or torch.cuda.is_available()]
    print_table(results, args)
    if args.json:
        print(json.dumps({"benchmark": "train_xe", "results": results}))


if __name__ == "__main__":
    main()
