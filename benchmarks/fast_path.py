"""Speed of the training fast path (``--fast on``, rdpp_cli/training/fast.py) against rdpp's eager
step, on the same weights and inputs: the XE step and the RL steps (R-DPP, SCST) at the paper's
shapes.

Shapes: Att2in 512/512/512 with dropout 0.5, vocabulary 9,487 words, 196 att regions of 2,048
features, a batch of ``--batch`` images (50); XE: 5 captions per image of ``--xe-words`` words
(``8-16`` by default: uniform lengths, as COCO's); RL: ``--m`` samples per image from a model whose
EOS bias makes captions of ``--words`` words on average (9, about what a COCO-trained model samples),
5 references per image (benchmarks/finetune.py's inputs). Each side is a whole training step as
``rdpp train-xe`` / ``rdpp finetune`` run it: the loss, backward, clipping by value 0.1 and the
Adam step; the fast sides start with ``FastPath.begin_step`` and never read the loss back.

Sides: ``eager`` (``--fast off``) and each ``--variants`` entry: ``fast`` is the device's settings
(``rdpp_cli.training.fast.SETTINGS``: on CUDA the teacher-forced pass in CUDA graphs
(``reduce-overhead``), the whole sampling pass compiled as one function, fused Adam); ``fast-default`` compiles the
teacher-forced pass without CUDA graphs; ``fast-graphs-sampling`` puts the whole sampling pass in
CUDA graphs too; ``fast-eager-sampling`` leaves it eager; ``fast-unfused`` keeps Adam unfused.

Before timing, each fast side is checked against the eager step (``check``; this is also where it
compiles, reported as "compile s"): XE with the same dropout masks, the loss and every gradient;
RL: the captions of the same step (same generator, so the same on-policy masks and, up to float
rounding of the sampling probabilities, the same captions), the reward's weights of the same
captions (tensors against numpy), and the loss and every gradient of the same captions under fixed
non-zero weights. The stated tolerances (float32 through two different kernel sets): loss 1e-5
relative, gradients 1e-3 of each parameter's largest gradient; a side outside them is marked
"NOT EQUAL".

Timing (benchmarks/timing.py): ``--warmup`` untimed steps per side (CUDA graphs record there), one
more for its peak memory, then ``--steps`` steps per side, interleaved (the order reversed every
other round), each waiting for the device; medians (best beside). GFLOP: the matrix products of one
eager step (torch.utils.flop_counter), the work every side does (a fast XE step runs the output
layer on padding positions too); "of matmul rate": GFLOP / median against this device's fp32
``torch.mm`` rate measured in the same run.

    python benchmarks/fast_path.py [--device cuda] [--sections xe,dpp,scst] [--variants fast,fast-default]
                                   [--steps 10] [--warmup 3] [--batch 50] [--m 5] [--words 9] [--xe-words 8-16]
                                   [--backend inductor] [--threads 2] [--json]

On a CPU (a sanity run: inductor compiles for minutes on 2 cores; ``--backend aot_eager`` checks
the mechanism quickly): ``python benchmarks/fast_path.py --device cpu --batch 4 --steps 2 --warmup 1``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SEQ_LEN, VOCAB, make_batch, make_refs, paper_model, parse_words  # noqa: E402
from timing import count_gflop, interleaved, machine_info, matmul_gflops, peak_mib, sync  # noqa: E402

from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id  # noqa: E402
from rdpp_cli.metrics.train_cider_torch import references_tensor  # noqa: E402
from rdpp_cli.models.att2in import Att2in  # noqa: E402
from rdpp_cli.training import fast as F  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402
from rdpp_cli.training.xe import fast_xe_loss, xe_loss  # noqa: E402

VARIANTS = {"fast": {}, "fast-default": {"train_mode": None},
            "fast-graphs-sampling": {"sample_mode": "reduce-overhead"},  # the whole sampling pass in CUDA graphs
            "fast-eager-sampling": {"compile_sampling": False}, "fast-unfused": {"fused_adam": False}}
LOSS_RTOL, GRAD_TOL = 1e-5, 1e-3


def fast_paths(args, device: torch.device) -> dict[str, F.FastPath]:
    base = replace(F.SETTINGS.get(device.type, F.FastSettings()), backend=args.backend)
    return {v: F.FastPath(device, replace(base, **VARIANTS[v])) for v in args.variants}


def update(model, opt, loss) -> torch.Tensor:
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def grads_of(model, loss) -> dict[str, torch.Tensor]:
    loss.backward()
    g = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return g


def guarded(fn, *args) -> dict:
    """``fn(*args)``, or ``{"error": its first line}`` when it raises (a side that cannot compile or
    capture is reported, and the others are still timed)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 -- reported in the table
        return {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"}


def flops_of(model, loss_fn):
    """A call for count_gflop: one forward and backward of ``loss_fn()``, the gradients dropped."""

    def run():
        loss_fn().backward()
        model.zero_grad(set_to_none=True)

    return run


def compare(loss_a, loss_b, ga: dict, gb: dict) -> dict:
    """|loss| relative difference and the largest gradient difference relative to each parameter's
    largest gradient (not alpha_net.bias: the softmax ignores a shift, so its gradient is rounding
    noise around 0), and whether both are within the stated tolerances."""
    a, b = float(loss_a.detach()), float(loss_b.detach())
    rel = abs(a - b) / max(abs(a), 1e-30)
    diffs = {k: float((ga[k] - gb[k]).abs().max() / ga[k].abs().max().clamp_min(1e-30)) for k in ga
             if k != "alpha_net.bias"}
    name = max(diffs, key=diffs.get)
    worst = diffs[name]
    return {"loss_rel_diff": rel, "grad_rel_diff": worst, "equal": rel <= LOSS_RTOL and worst <= GRAD_TOL,
            "grad_worst": f"{name} (|g| max {float(ga[name].abs().max()):.1e})"}


# -- the XE step ------------------------------------------------------------------------------------

def xe_sides(args, device: torch.device, base: Att2in):
    batch = make_batch(args.batch, parse_words(args.xe_words), device)
    sides, checks, models = {}, {}, {}
    for name, fast in {"eager": None, **fast_paths(args, device)}.items():
        m = copy.deepcopy(base).train()
        opt = fast.optimizer(m.parameters(), 4e-4) if fast else torch.optim.Adam(m.parameters(), lr=4e-4)
        if fast is None:
            sides[name] = lambda m=m, opt=opt: update(m, opt, xe_loss(m, batch))
        else:
            step = fast_xe_loss(fast)
            checks[name] = guarded(check_xe, base, fast, batch)
            if "error" in checks[name]:
                continue

            def run(m=m, opt=opt, step=step, fast=fast):
                fast.begin_step()
                return update(m, opt, step(m, batch))

            sides[name] = run
        models[name] = m
    return sides, checks, flops_of(models["eager"], lambda: xe_loss(models["eager"], batch)), batch.size


def check_xe(base: Att2in, fast: F.FastPath, batch) -> dict:
    """The fast pass against the eager one on the same dropout masks (the first call compiles)."""
    m = copy.deepcopy(base).train()
    drop = fast.xe_dropout(m, batch.labels, batch.att.shape[1])
    tok, mask = m.token_logprobs(batch.att, batch.labels, drop=drop)
    want = -tok.sum() / mask.sum()
    g_want = grads_of(m, want)
    t = time.perf_counter()
    fast.begin_step()
    tok, mask = fast.token_logprobs(m, batch.att, batch.labels, None, drop)
    got = -tok.sum() / mask.sum()
    g_got = grads_of(m, got)
    sync(batch.att.device)
    return {**compare(want, got, g_want, g_got), "compile_s": time.perf_counter() - t}


# -- the RL steps -----------------------------------------------------------------------------------

def rl_sides(args, device: torch.device, reward: str):
    model = paper_model(words=args.words, device=device)
    batch = make_batch(args.batch, device=device)
    refs = make_refs(np.random.default_rng(0), args.batch)
    df = doc_freq_with_eos([[list(r[r > 0]) for r in rs] for rs in refs], eos_id(VOCAB))
    cider = TrainCider(df, eos_id(VOCAB), SEQ_LEN)

    class Refs:  # RewardStep's data: the batch's references, and the rows the fast path's table reads
        label_end = np.cumsum([len(r) for r in refs])
        label_start = label_end - [len(r) for r in refs]

        @staticmethod
        def references_ids(index):
            return [refs[i] for i in index]

        @staticmethod
        def _all_labels():
            return np.concatenate(refs)

    kw = dict(data=Refs, cider=cider, reward=reward, m=args.m, max_len=SEQ_LEN, seed=1)
    sides, checks, models = {}, {}, {}
    for name, fast in {"eager": None, **fast_paths(args, device)}.items():
        m = copy.deepcopy(model).train()
        opt = fast.optimizer(m.parameters(), 5e-5) if fast else torch.optim.Adam(m.parameters(), lr=5e-5)
        step = RewardStep(**kw, fast=fast)
        if fast is not None:
            checks[name] = guarded(check_rl, model, RewardStep(**kw), step, batch, refs)
            if "error" in checks[name]:
                continue

        def run(m=m, opt=opt, step=step, fast=fast):
            if fast is not None:
                fast.begin_step()
            return update(m, opt, step(m, batch)[0])

        sides[name], models[name] = run, m
    eager = RewardStep(**kw)
    return sides, checks, flops_of(models["eager"], lambda: eager(models["eager"], batch)[0]), batch.size


def check_rl(base: Att2in, eager: RewardStep, fast: RewardStep, batch, refs: list[np.ndarray]) -> dict:
    """The fast step's captions, reward and policy-gradient pass against the eager step's: the
    captions of the same step (same generator); the weights of the same captions (numpy against
    tensors); the loss and gradients of the same captions under fixed non-zero weights (a random
    model's samples score about 0, which would make every weight and gradient 0)."""
    m = copy.deepcopy(base).train()
    t = time.perf_counter()
    fast.fast.begin_step()
    d = fast.draw(m, batch)
    d_e = eager.draw(m, batch)
    T = d_e.samples.shape[-1]
    same = (d.samples[..., :T] == d_e.samples).all(-1).float().mean().item()
    w_np, _ = eager.weights(d.samples.cpu().numpy(), d.greedy, refs)
    w_t, _ = fast.device_weights(d.samples, d.greedy, *references_tensor(refs, batch.att.device))
    w = torch.linspace(-1.0, 1.0, w_np.numel()).view(w_np.shape)
    want = eager.loss(m, batch, d, w)[0]
    g_want = grads_of(m, want)
    got = fast.loss(m, batch, d, w)[0]
    g_got = grads_of(m, got)
    sync(batch.att.device)
    return {**compare(want, got, g_want, g_got), "weights_abs_diff": float((w_t.cpu() - w_np).abs().max()),
            "same_captions": same, "compile_s": time.perf_counter() - t}


# -- timing -------------------------------------------------------------------------------------------

def bench(args, device: torch.device, section: str) -> dict:
    if section == "xe":
        sides, checks, flop_fn, images = xe_sides(args, device, paper_model(device=device))
    else:
        sides, checks, flop_fn, images = rl_sides(args, device, section)
    for name in [n for n in sides if n != "eager"]:  # warm-up (CUDA graphs record here), a failure reported

        def warm(fn=sides[name]):
            for _ in range(args.warmup):
                fn()
            sync(device)
            return {}

        err = guarded(warm)
        if err:
            checks[name] = {**checks[name], **err}
            del sides[name]
    for _ in range(args.warmup):
        sides["eager"]()
    gflop = count_gflop(flop_fn)
    peak = {name: peak_mib(fn, device) for name, fn in sides.items()}
    rate = [matmul_gflops("fp32", device, args.matmul_size)]

    def synced(fn):
        return lambda: (fn(), sync(device))

    t = interleaved({name: synced(fn) for name, fn in sides.items()}, args.steps)
    rate.append(matmul_gflops("fp32", device, args.matmul_size))
    mm = float(np.median(rate))
    rows = {name: {"s_per_step": t[name].median, "best_s": t[name].best, "images_per_s": images / t[name].median,
                   "vs_eager": t["eager"].median / t[name].median, "matmul_fraction": gflop / t[name].median / mm,
                   "peak_mib": peak[name], "times": t[name].times, **checks.get(name, {})} for name in sides}
    rows.update({name: c for name, c in checks.items() if "error" in c})
    return {"section": section, "device": str(device), "gflop": gflop, "matmul_gflops": mm, "sides": rows}


def print_tables(results: list[dict], args) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=160)
    for r in results:
        what = {"xe": f"XE step, 5 captions of {args.xe_words} words", "dpp": f"R-DPP step, m = {args.m}",
                "scst": f"SCST step, m = {args.m} + greedy"}[r["section"]]
        table = Table(title=f"{what}, batch {args.batch}, paper shapes, on {r['device']}: median of {args.steps} "
                            f"interleaved steps after {args.warmup} warm-ups")
        for col in ("side", "ms/step", "best", "images/s", "vs eager", "of matmul rate", "peak MiB", "compile s",
                    "loss / grad diff", "same numbers"):
            table.add_column(col, justify="right")
        for name, s in r["sides"].items():
            if "error" in s:
                table.add_row(name, "failed", *[""] * 7, s["error"])
                continue
            chk = "-" if "equal" not in s else f"{s['loss_rel_diff']:.1e} / {s['grad_rel_diff']:.1e}"
            same = "-" if "equal" not in s else ("yes" if s["equal"] else f"NOT EQUAL (worst: {s['grad_worst']})")
            if "same_captions" in s:
                same += f" ({100 * s['same_captions']:.0f} % same captions, weights ±{s['weights_abs_diff']:.0e})"
            table.add_row(name, f"{1e3 * s['s_per_step']:.1f}", f"{1e3 * s['best_s']:.1f}", f"{s['images_per_s']:.0f}",
                          f"{s['vs_eager']:.2f}×", f"{100 * s['matmul_fraction']:.1f} %", f"{s['peak_mib']:,.0f}",
                          f"{s['compile_s']:.0f}" if "compile_s" in s else "-", chk, same)
        con.print(table)
        con.print(f"{r['gflop']:.0f} GFLOP per eager step; fp32 matmul rate {r['matmul_gflops']:.0f} GFLOP/s "
                  f"({args.matmul_size}² torch.mm, median of the runs before and after)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sections", default="xe,dpp,scst", help="comma-separated: xe, dpp, scst")
    ap.add_argument("--variants", default="fast", help=f"fast sides, comma-separated: {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per side, interleaved")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per side first (CUDA graphs record)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--m", type=int, default=5, help="RL samples per image")
    ap.add_argument("--words", type=float, default=9.0, help="mean words of the RL samples")
    ap.add_argument("--xe-words", default="8-16", help="XE caption words: N or MIN-MAX")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: a quick CPU check)")
    ap.add_argument("--matmul-size", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}; use {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here")
    results = [bench(args, device, s) for s in args.sections.split(",") if s]
    print_tables(results, args)
    if args.json:
        print(json.dumps({"benchmark": "fast_path", **machine_info(), "results": results}))


if __name__ == "__main__":
    main()
