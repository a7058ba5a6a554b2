"""The two per-step costs docs/decoding.md quotes, measured: one random draw per row, and nucleus
sampling when the nucleus is not among the top 128 words.

  (1) ``decode._draw`` (inverse-CDF: cumsum + searchsorted) against ``torch.multinomial(probs, 1)``
      on the CPU, 200 rows x 9,488 words + EOS (COCO's vocabulary), peaked (trained-model-like)
      and flat rows. Both are checked to draw from the same distribution first (frequencies of
      100,000 draws from a small distribution agree within 4 standard errors).
  (2) ``decode._nucleus`` at p = 0.9 on 200 rows: peaked rows (the nucleus is among the top 128
      words) and flat rows (an untrained model: the full-sort fallback).

Same number of runs each, interleaved, medians (best beside).

    python benchmarks/decode_draw.py [--repeat 21] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, machine  # noqa: E402

from rdpp_cli.decoding.decode import _draw, _nucleus  # noqa: E402

ROWS, WORDS = 200, 9488


def rows(peaked: bool, seed: int = 0) -> torch.Tensor:
    """(ROWS, WORDS + 1) probabilities: softmax of Gaussian logits, scaled up for peaked rows."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, WORDS + 1, generator=g) * (6.0 if peaked else 0.1)
    return torch.softmax(logits, -1)


def same_distribution() -> float:
    """Largest |frequency difference| / standard error between _draw and multinomial over 8 outcomes."""
    p = torch.tensor([[0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02]]).repeat(100_000, 1)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    a = torch.bincount(_draw(p, g1), minlength=8).double() / len(p)
    b = torch.bincount(torch.multinomial(p, 1, generator=g2).squeeze(1), minlength=8).double() / len(p)
    se = (p[0].double() * (1 - p[0].double()) * 2 / len(p)).sqrt()
    return float(((a - b).abs() / se).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    z = same_distribution()
    if z > 4:
        raise SystemExit(f"_draw and torch.multinomial draw from different distributions ({z:.1f} standard errors)")
    g = torch.Generator().manual_seed(0)
    lines = []
    for name, peaked in (("peaked", True), ("flat", False)):
        probs = rows(peaked)
        t = interleaved({"multinomial": lambda: torch.multinomial(probs, 1, generator=g),
                         "_draw": lambda: _draw(probs, g)}, args.repeat)
        m, d = t["multinomial"], t["_draw"]
        lines.append(f"(1) one draw per row, {name} rows: torch.multinomial {m.median * 1e3:.2f} ms "
                     f"(best {m.best * 1e3:.2f}), _draw {d.median * 1e3:.2f} ms (best {d.best * 1e3:.2f}): "
                     f"{m.median / d.median:.1f}x cheaper (medians)")
    peaked, flat = rows(True), rows(False)
    mass = peaked.topk(128, -1).values.sum(-1)
    assert (mass >= 0.9).all() and (flat.topk(128, -1).values.sum(-1) < 0.9).all()
    t = interleaved({"peaked": lambda: _nucleus(peaked, 0.9, g), "flat": lambda: _nucleus(flat, 0.9, g)}, args.repeat)
    p_, f_ = t["peaked"], t["flat"]
    lines.append(f"(2) nucleus p=0.9: peaked rows (top-128 path) {p_.median * 1e3:.1f} ms (best {p_.best * 1e3:.1f}); "
                 f"flat rows (full sort) {f_.median * 1e3:.1f} ms (best {f_.best * 1e3:.1f}) per step: "
                 f"{f_.median / p_.median:.0f}x (medians)")
    print(f"{ROWS} rows x {WORDS:,} words + EOS, CPU, {args.threads} thread(s), {args.repeat} interleaved runs each; "
          f"distributions agree ({z:.1f} standard errors at most)")
    print("\n".join(lines))
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
