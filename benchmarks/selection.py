"""``rdpp sample --select`` against drawing, and (``--what draw``) the costs of one draw per row.

``select`` (default): choosing ``--keep`` of ``--candidates`` random samples per image for
``--select-images`` images by every method (DPP greedy MAP with consensus or log-prob quality, MBR,
log-prob; CIDEr-D df of ``--df``, default a synthetic Zipf set of COCO's size) against drawing them
(``decode``, a random paper-preset Att2in at COCO's shapes), and the batched greedy MAP step
against a per-image numpy loop of Chen et al.'s algorithm, checked first to choose the same items.
``draw``: ``decode._draw`` against ``torch.multinomial`` (checked first to draw from the same
distribution) and ``decode._nucleus``'s top-128 path against its full sort, 200 rows of 9,489
probabilities. Interleaved, medians; benchmarks/README.md says more of both.

    python benchmarks/selection.py [--json] [--threads 2] [--device cpu,cuda] [--select-images 5000]
                                   [--candidates 50] [--keep 5] [--repeats 3] [--clock wall|cpu] [--df cider_df.h5]
    python benchmarks/selection.py --select-images 50 --candidates 6 --keep 2 --repeats 1   # a quick check
    python benchmarks/selection.py --what draw [--repeats 21] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BATCH, SEQ_LEN, VOCAB, features, make_model, zipf_p  # noqa: E402
from timing import interleaved, machine, print_table  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, _draw, _nucleus, decode  # noqa: E402
from rdpp_cli.decoding.select import SelectConfig, _cider_terms, greedy_map, select  # noqa: E402
from rdpp_cli.metrics.cider import DocFreq  # noqa: E402
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos  # noqa: E402

VARIANTS = [("dpp", "consensus"), ("dpp", "logprob"), ("mbr", None), ("logprob", None)]


def zipf_df(path: Path, images: int = 20000, seed: int = 0) -> Path:
    """A cider_df.h5 of synthetic references: 5 per image, 12 Zipf-distributed words and the EOS."""
    rng = np.random.default_rng(seed)
    refs = rng.choice(np.arange(1, VOCAB + 1), p=zipf_p(), size=(images, 5, 12))
    doc_freq_with_eos([r.tolist() for r in refs], VOCAB + 1).save_h5(path)
    return path


def ref_greedy_map(L: np.ndarray, k: int) -> list[int]:
    """Chen, Zhang & Zhou's fast greedy MAP for one kernel, a plain numpy loop (the published form)."""
    C = L.shape[0]
    cis = np.zeros((k, C))
    d2 = np.diag(L).copy()
    j = int(np.argmax(d2))
    chosen = [j]
    while len(chosen) < k:
        t = len(chosen) - 1
        e = (L[j, :] - cis[:t, j] @ cis[:t, :]) / np.sqrt(d2[j])
        cis[t, :] = e
        d2 = d2 - e ** 2
        d2[chosen] = -np.inf
        j = int(np.argmax(d2))
        chosen.append(j)
    return chosen


def sides(device: torch.device, images: int, C: int, K: int, df_path: Path) -> dict:
    """The timed calls: ``draw`` (C random samples per image, batches of BATCH images), each
    selection on the drawn captions, the batched greedy MAP step and its per-image reference."""
    model = make_model("att2in", device=device).eval()
    att = features(BATCH, torch.Generator().manual_seed(0)).to(device)
    sizes = [min(BATCH, images - s) for s in range(0, images, BATCH)]
    cfg = DecodeConfig(method="random", n=C, max_len=SEQ_LEN).check()
    gen = torch.Generator(device=device).manual_seed(0)
    drawn: list = []

    def draw():
        drawn.clear()
        with torch.no_grad():
            drawn.extend(decode(model, att[:b], cfg, generator=gen) for b in sizes)
        if device.type == "cuda":
            torch.cuda.synchronize()

    scorer = TrainCider(DocFreq.from_h5(df_path), VOCAB + 1, SEQ_LEN, SEQ_LEN)  # what rdpp sample builds

    def choose(method, quality):
        sel = SelectConfig(method, C, quality).check(K)
        return lambda: [select(d.tokens, d.seq_logprob, d.lengths, K, sel, scorer) for d in drawn]

    draw()  # the captions every selection runs on
    kernels = []
    for d in drawn:
        q, S = _cider_terms(d.tokens.cpu().numpy(), scorer)
        kernels.append(torch.from_numpy(S * q[:, :, None] * q[:, None, :]))
    ours = lambda: [greedy_map(L, K) for L in kernels]  # noqa: E731
    ref = lambda: [[ref_greedy_map(L_b, K) for L_b in L.numpy()] for L in kernels]  # noqa: E731
    if torch.cat(ours()).tolist() != [r for rs in ref() for r in rs]:
        raise SystemExit("batched greedy MAP chose other items than the per-image reference; not timed")
    return {"draw": draw, **{f"{m}-{q}" if q else m: choose(m, q) for m, q in VARIANTS}, "greedy": ours, "ref": ref}


def run(device: torch.device, images: int, C: int, K: int, repeats: int, df_path: Path, clock) -> list[dict]:
    fns = sides(device, images, C, K, df_path)
    for name, fn in fns.items():
        if name != "draw":
            fn()  # warm-up (draw's was the captions' draw)
    med = {k: t.median for k, t in interleaved(fns, repeats, clock=clock).items()}
    row = lambda what, key, **kw: {"device": device.type, "what": what, "images": images,  # noqa: E731
                                   "seconds": round(med[key], 4), "ms_per_image": round(1e3 * med[key] / images, 4),
                                   "vs_draw": round(med[key] / med["draw"], 5), **kw}
    rows = [row(f"draw {C} random samples per image (decode)", "draw")]
    rows += [row(f"select {K} of {C}: {name} (kernel + choice, CPU)", name)
             for name in fns if name not in ("draw", "greedy", "ref")]
    rows.append(row(f"greedy MAP step alone, batched ({K} of {C})", "greedy",
                    reference="per-image numpy loop (Chen et al.)", ref_seconds=round(med["ref"], 4),
                    speedup=round(med["ref"] / med["greedy"], 2)))
    return rows


def show(rows: list[dict], args) -> None:
    print_table(f"rdpp sample --select: {args.keep} of {args.candidates} per image, {args.select_images} images (paper "
                f"preset, random weights; medians of {args.repeats} interleaved runs, CPU threads {args.threads}, "
                f"{args.clock} clock)", ["device", "what", "s", "ms/image", "x draw", "reference s", "speedup"],
                [[r["device"], r["what"], f"{r['seconds']:.3f}", f"{r['ms_per_image']:.3f}", f"{r['vs_draw']:.4f}",
                  f"{r['ref_seconds']:.3f}" if "reference" in r else "-",
                  f"{r['speedup']:.1f}x" if "reference" in r else "-"] for r in rows], width=170, left=2)
    print(machine())


DRAW_ROWS, DRAW_WORDS = 200, 9488


def draw_rows(peaked: bool, seed: int = 0) -> torch.Tensor:
    """(DRAW_ROWS, DRAW_WORDS + 1) probabilities: softmax of Gaussian logits, scaled up for peaked rows."""
    logits = torch.randn(DRAW_ROWS, DRAW_WORDS + 1, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(logits * (6.0 if peaked else 0.1), -1)


def same_distribution() -> float:
    """Largest |frequency difference| / standard error between _draw and multinomial over 8 outcomes."""
    p = torch.tensor([[0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02]]).repeat(100_000, 1)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    a = torch.bincount(_draw(p, g1), minlength=8).double() / len(p)
    b = torch.bincount(torch.multinomial(p, 1, generator=g2).squeeze(1), minlength=8).double() / len(p)
    se = (p[0].double() * (1 - p[0].double()) * 2 / len(p)).sqrt()
    return float(((a - b).abs() / se).max())


def draw_costs(repeat: int, threads: int) -> None:
    """``--what draw``: one draw per row against torch.multinomial, and nucleus sampling's two paths."""
    z = same_distribution()
    if z > 4:
        raise SystemExit(f"_draw and torch.multinomial draw from different distributions ({z:.1f} standard errors)")
    g, ms = torch.Generator().manual_seed(0), lambda t: f"{t.median * 1e3:.2f} ms (best {t.best * 1e3:.2f})"
    print(f"{DRAW_ROWS} rows x {DRAW_WORDS:,} words + EOS, CPU, {threads} thread(s), {repeat} interleaved runs each; "
          f"distributions agree ({z:.1f} standard errors at most)")
    for name, peaked in (("peaked", True), ("flat", False)):
        probs = draw_rows(peaked)
        t = interleaved({"multinomial": lambda: torch.multinomial(probs, 1, generator=g),
                         "_draw": lambda: _draw(probs, g)}, repeat)
        m, d = t["multinomial"], t["_draw"]
        print(f"(1) one draw per row, {name} rows: torch.multinomial {ms(m)}, _draw {ms(d)}: "
              f"{m.median / d.median:.1f}x cheaper (medians)")
    peaked, flat = draw_rows(True), draw_rows(False)
    assert (peaked.topk(128, -1).values.sum(-1) >= 0.9).all() and (flat.topk(128, -1).values.sum(-1) < 0.9).all()
    t = interleaved({"peaked": lambda: _nucleus(peaked, 0.9, g), "flat": lambda: _nucleus(flat, 0.9, g)}, repeat)
    print(f"(2) nucleus p=0.9: peaked rows (top-128 path) {ms(t['peaked'])}; flat rows (full sort) {ms(t['flat'])} "
          f"per step: {t['flat'].median / t['peaked'].median:.0f}x (medians)")
    print(f"machine: {machine()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what", choices=("select", "draw"), default="select", help="draw: _draw and nucleus sampling")
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: 2; draw: 1)")
    ap.add_argument("--device", default="cpu,cuda", help="comma list; cuda is skipped without a GPU")
    ap.add_argument("--select-images", type=int, default=5000, help="images to draw for and select on")
    ap.add_argument("--candidates", type=int, default=50, help="C: samples drawn per image")
    ap.add_argument("--keep", type=int, default=5, help="K: captions selected per image")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs of each side (default and least: 3; draw: 21)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (all threads), steadier than wall time on a shared machine")
    ap.add_argument("--df", type=Path, default=None, help="a cider_df.h5 (default: a synthetic COCO-sized one)")
    args = ap.parse_args()
    draw = args.what == "draw"
    args.threads = args.threads or (1 if draw else 2)
    torch.set_num_threads(args.threads)
    if draw:
        return draw_costs(args.repeats or 21, args.threads)
    args.repeats = max(args.repeats or 3, 3)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory(prefix="rdpp-bench-df-") as tmp:
        df = args.df or zipf_df(Path(tmp) / "cider_df.h5")
        rows = [r for dev in args.device.split(",") if dev != "cuda" or torch.cuda.is_available()
                for r in run(torch.device(dev), args.select_images, args.candidates, args.keep, args.repeats, df,
                             clock)]
    show(rows, args)
    if args.json:
        print(json.dumps({"benchmark": "selection", "threads": args.threads, "clock": args.clock, "machine": machine(),
                          "select_rows": rows}))


if __name__ == "__main__":
    main()
