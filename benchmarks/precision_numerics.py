"""How far bf16 is from fp32 at the paper's shapes, and how closely the on-policy replay matches
the sampling pass in each precision (docs/training.md "Precision").

On one batch (paper preset, V = 9,487, 196×2048 att; a model whose output layer is scaled up so
that its log-probs are as peaked as a trained model's, and whose EOS bias gives ~9-word captions):

1. XE on captions the model samples itself: the loss and every parameter's gradient under bf16
   autocast against fp32 (dropout off);
2. on-policy replay, in fp32 and in bf16: M = 5 captions per image sampled step by step with
   pre-drawn dropout masks (``RewardStep.sample``), then the batched teacher-forced pass that
   replays the masks (``RewardStep.policy_logprobs``); the per-token and per-caption differences
   of the two log-probabilities.

Stated tolerances (PASS/FAIL): bf16 XE loss within 1e-2 relative of fp32, each parameter's
gradient within 1e-1 in relative L2 norm (bf16 rounds the logits to 8 significant bits, 0.06 at
|logit| ≈ 10, which moves a peaked softmax by a few percent; measured on the CPU: 1-5 %); replay in fp32 within 1e-4 per token; replay in bf16 within 0.1 per
token (p99) and 0.01 (mean) -- a bf16 rounding of the logits is ~0.03 at |logit| ~ 8, and the two
passes may round differently where the device picks different kernels for the two shapes (on the
CPU they agree exactly).

    python benchmarks/precision_numerics.py [--device cpu|cuda] [--batch 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SEQ_LEN as L, make_batch, paper_model  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.att2in import Att2in  # noqa: E402
from rdpp_cli.precision import autocast, native_bf16  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402
from rdpp_cli.training.xe import xe_loss  # noqa: E402

TOL = {"xe_loss_rel": 1e-2, "xe_grad_rel": 1e-1, "replay_fp32_max": 1e-4, "replay_bf16_p99": 0.1,
       "replay_bf16_mean": 0.01}


def make(batch: int, device: torch.device) -> tuple[Att2in, Batch]:
    model = paper_model(device=device)
    with torch.no_grad():
        model.logit.weight.mul_(30.0)  # peaked: sampled tokens' mean |log p| ≈ 2.4, as a trained model's
        model.logit.bias[0] = 15.0  # captions of ≈ 8.5 words
    return model, make_batch(batch, device=device)


def xe_numerics(model: Att2in, batch: Batch) -> dict[str, float]:
    """The XE loss and gradients on 5 captions per image the model itself samples (so the loss is
    a trained model's, not that of random words): bf16 against fp32. Gradients: the largest over
    the parameters of ‖g_bf16 − g_fp32‖ / ‖g_fp32‖."""
    with torch.no_grad():
        d = decode(model.eval(), batch.att, DecodeConfig(method="random", n=5, max_len=L),
                   generator=torch.Generator(device=batch.att.device).manual_seed(1))
    batch = Batch(**{**batch.__dict__, "labels": d.tokens})
    out = {}
    for prec in ("fp32", "bf16"):
        model.zero_grad(set_to_none=True)
        with autocast(prec, batch.att.device):
            loss = xe_loss(model, batch)
        loss.backward()
        out[prec] = float(loss.detach()), {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.train()
    (l32, g32), (l16, g16) = out["fp32"], out["bf16"]
    keys = [k for k in g32 if k != "alpha_net.bias"]  # softmax ignores a shift: its gradient is rounding noise
    grad = max(float((g16[k] - g32[k]).norm() / g32[k].norm()) for k in keys)
    entry = max(float((g16[k] - g32[k]).abs().max() / g32[k].abs().max()) for k in keys)
    return {"xe_loss_fp32": l32, "xe_loss_bf16": l16, "xe_loss_rel": abs(l16 - l32) / l32, "xe_grad_rel": grad,
            "xe_grad_entry_rel": entry}


def replay(model: Att2in, batch: Batch, precision: str) -> dict[str, float]:
    step = RewardStep(data=None, cider=None, reward="dpp", m=5, max_len=L, seed=0)
    img = Batch(**{**batch.__dict__, "labels": batch.labels[:, :1]})
    with torch.no_grad(), autocast(precision, batch.att.device):
        d = step.sample(model, img)
        tf, mask = step.policy_logprobs(model, img, d)
    on = mask.bool()
    drawn = d.logprobs.reshape(tf.shape)
    diff = (tf - drawn)[on].abs().float()
    seq = ((tf - drawn) * mask).sum(1).abs()
    return {"tokens": int(on.sum()), "words": float(d.lengths.float().mean()), "mean_abs_logp": float(drawn[on].abs().mean()),
            "max": float(diff.max()), "p99": float(diff.quantile(0.99)), "mean": float(diff.mean()),
            "seq_max": float(seq.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model, batch = make(args.batch, device)
    res = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "native_bf16": native_bf16(device), **xe_numerics(model, batch),
           "replay": {p: replay(model, batch, p) for p in ("fp32", "bf16")}}
    r32, r16 = res["replay"]["fp32"], res["replay"]["bf16"]
    checks = {
        "bf16 XE loss vs fp32 (relative)": (res["xe_loss_rel"], TOL["xe_loss_rel"]),
        "bf16 XE gradients vs fp32 (worst ‖Δg‖/‖g‖)": (res["xe_grad_rel"], TOL["xe_grad_rel"]),
        "fp32 replay vs sampling, max per token": (r32["max"], TOL["replay_fp32_max"]),
        "bf16 replay vs sampling, p99 per token": (r16["p99"], TOL["replay_bf16_p99"]),
        "bf16 replay vs sampling, mean per token": (r16["mean"], TOL["replay_bf16_mean"]),
    }
    print(f"precision numerics on {res['device']} (native bf16: {res['native_bf16']}), batch {args.batch}, "
          f"XE loss fp32 {res['xe_loss_fp32']:.4f}, bf16 {res['xe_loss_bf16']:.4f}; largest gradient entry "
          f"off by {res['xe_grad_entry_rel']:.1e} of the parameter's largest")
    for p, r in res["replay"].items():
        print(f"  replay {p}: {r['tokens']} tokens ({r['words']:.1f} words per caption, mean |log p| "
              f"{r['mean_abs_logp']:.2f}): |Δ log p| per token max {r['max']:.2e}, p99 {r['p99']:.2e}, "
              f"mean {r['mean']:.2e}; per caption max {r['seq_max']:.2e}")
    ok = True
    print(f"  {'check':<48}{'measured':>12}{'tolerance':>12}")
    for name, (v, tol) in checks.items():
        good = v <= tol
        ok &= good
        print(f"  {name:<48}{v:>12.2e}{tol:>12.0e}  {'PASS' if good else 'FAIL'}")
    res["pass"] = ok
    if args.json:
        print(json.dumps(res))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
