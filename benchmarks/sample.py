"""Decoding speed (captions/s) of every method at the paper's shapes, against simple references.

Shapes: Att2in paper preset (512/512/512), COCO's vocabulary (9,487 words → 9,488 logits), 14×14 = 196
att regions of 2,048 features, a batch of ``--batch`` images (10), captions of at most 16 words,
``--n`` (20) captions per image for the sampling methods, beam width 3 (and 20) for beam search,
4 groups × 5 beams for diverse beam search. Random weights: every method runs the full 17 steps
or close to it, which is the slow case.

References, run in the same process on the same weights and images:

- sampling (random / topk / nucleus): self-critical.pytorch's batched ``_sample`` with
  ``sample_n``: the embedded att features and keys are *copied* n times (``repeat_tensors``), the
  attention is the literal ``alpha_net(tanh(p_att + h2att(h)))``;
- greedy, beam, dbs: the same ``rdpp`` decoder called one image at a time (a per-image loop, as
  self-critical.pytorch's older beam search does).

    python benchmarks/sample.py [--json] [--threads 2] [--batch 10] [--n 20] [--repeats 2] [--device cpu,cuda]
                                [--clock wall|cpu] [--no-ref] [--sections decode,select]
                                [--select-images 5000] [--candidates 50] [--keep 5] [--df cider_df.h5]

Selection section (``rdpp sample --select``): choosing ``--keep`` (5) of ``--candidates`` (50) random
samples per image for ``--select-images`` (5,000) images, against drawing those 50 samples
(``decode``, method random, batches of 50 images as ``rdpp sample``), timed interleaved, medians of
``--repeats``; the selection runs on the drawn captions, with the CIDEr-D document frequencies of
``--df`` (default: a synthetic Zipf set of 20,000 images, ~2M n-grams, the size of COCO's). The
greedy MAP step alone is also timed against a per-image numpy loop of Chen et al.'s algorithm,
checked to choose the same items first.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from rdpp_cli.decoding import DecodeConfig, decode
from rdpp_cli.models.att2in import Att2in, config_from_preset

VOCAB, REGIONS, ATT_DIM, MAX_LEN = 9487, 196, 2048, 16


@torch.no_grad()
def ref_sample(model: Att2in, att: torch.Tensor, cfg: DecodeConfig, generator: torch.Generator) -> torch.Tensor:
    """self-critical.pytorch-style batched sampling: features repeated n times, literal attention."""
    m = model
    B, n, H = att.shape[0], cfg.n, m.config.rnn_size
    a = F.relu(m.att_embed(att))
    p = m.ctx2att(a)
    a, p = a.repeat_interleave(n, 0), p.repeat_interleave(n, 0)  # utils.repeat_tensors
    N = B * n
    h, c = a.new_zeros(N, H), a.new_zeros(N, H)
    it = torch.zeros(N, dtype=torch.long, device=att.device)
    seq = torch.zeros(N, cfg.max_len, dtype=torch.long, device=att.device)
    done = torch.zeros(N, dtype=torch.bool, device=att.device)
    for t in range(cfg.max_len + 1):
        xt = F.relu(m.embed(it))
        dot = m.alpha_net(torch.tanh(p + m.h2att(h).unsqueeze(1))).squeeze(2)
        w = F.softmax(dot, 1)
        att_res = torch.bmm(w.unsqueeze(1), a).squeeze(1)
        sums = m.i2h(xt) + m.h2h(h)
        sig = torch.sigmoid(sums[:, :3 * H])
        g = sums[:, 3 * H:] + m.a2c(att_res)
        g = torch.max(g[:, :H], g[:, H:])
        c = sig[:, H:2 * H] * c + sig[:, :H] * g
        h = sig[:, 2 * H:] * torch.tanh(c)
        lp = F.log_softmax(m.logit(h), 1)
        if t == cfg.max_len:
            break
        logits = lp / cfg.temperature
        if cfg.method == "topk":
            vals, idx = logits.topk(cfg.top_k, -1)
            it = idx.gather(1, torch.multinomial(vals.softmax(-1), 1, generator=generator)).squeeze(1)
        elif cfg.method == "nucleus":
            sp, si = logits.softmax(-1).sort(-1, descending=True)
            sp = sp * ((sp.cumsum(-1) - sp) < cfg.top_p)
            it = si.gather(1, torch.multinomial(sp, 1, generator=generator)).squeeze(1)
        else:
            it = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
        it = it.masked_fill(done, 0)
        seq[:, t] = it
        done |= it == 0
        if bool(done.all()):
            break
    return seq


def per_image(model, att, cfg, generator):
    for b in range(att.shape[0]):
        decode(model, None, att[b:b + 1], cfg, generator=generator)


CASES = [  # name, DecodeConfig kwargs, reference
    ("greedy", dict(method="greedy", n=1), "per-image"),
    ("random n=20", dict(method="random", n=20), "repeat"),
    ("topk k=5 n=20", dict(method="topk", n=20, top_k=5), "repeat"),
    ("nucleus p=0.9 n=20", dict(method="nucleus", n=20, top_p=0.9), "repeat"),
    ("beam 3 (n=3)", dict(method="beam", n=3, beam=3), "per-image"),
    ("beam 20 (n=20)", dict(method="beam", n=20, beam=20), "per-image"),
    ("dbs 4x5 (n=20)", dict(method="dbs", n=20, beam=5, groups=4, diversity_lambda=0.5), "per-image"),
]


CLOCK = time.perf_counter


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = CLOCK()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, CLOCK() - t0)
    return best


def run(device: torch.device, batch: int, n: int, repeats: int, with_ref: bool) -> list[dict]:
    torch.manual_seed(0)
    model = Att2in(config_from_preset("paper", VOCAB, ATT_DIM, ATT_DIM, MAX_LEN)).to(device).eval()
    att = torch.randn(batch, REGIONS, ATT_DIM, device=device).relu_()
    rows = []
    for name, kw, ref in CASES:
        if kw.get("n", 1) == 20 and n != 20:
            kw = dict(kw, n=n, beam=n if kw["method"] == "beam" else kw.get("beam", 3))
        cfg = DecodeConfig(max_len=MAX_LEN, **kw).check()
        gen = torch.Generator(device=device).manual_seed(0)
        t = _time(lambda: decode(model, None, att, cfg, generator=gen), repeats, device)
        caps = batch * cfg.n
        row = {"device": device.type, "method": name, "images": batch, "captions": caps,
               "seconds": round(t, 4), "captions_per_s": round(caps / t, 1)}
        if with_ref:
            if ref == "repeat":
                r = _time(lambda: ref_sample(model, att, cfg, gen), repeats, device)
            else:
                r = _time(lambda: per_image(model, att, cfg, gen), max(1, repeats // 2), device)
            row.update(reference=ref, ref_captions_per_s=round(caps / r, 1), speedup=round(r / t, 2))
        rows.append(row)
    return rows


# -- selection: K of C candidates per image against drawing the C ------------------------------------

def _zipf_df(path, images: int = 20000, seed: int = 0):
    """A cider_df.h5 of synthetic references: 5 per image, 12 Zipf-distributed words and the EOS."""
    import numpy as np

    from rdpp_cli.metrics.train_cider import doc_freq_with_eos

    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    refs = rng.choice(np.arange(1, VOCAB + 1), p=p / p.sum(), size=(images, 5, 12))
    doc_freq_with_eos([r.tolist() for r in refs], VOCAB + 1).save_h5(path)
    return path


def ref_greedy_map(L, k: int) -> list[int]:
    """Chen, Zhang & Zhou's fast greedy MAP for one kernel, a plain numpy loop (the published form)."""
    import numpy as np

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


def run_select(device: torch.device, images: int, C: int, K: int, repeats: int, df_path) -> list[dict]:
    import numpy as np

    from rdpp_cli.decoding.select import SelectConfig, _cider_terms, greedy_map, select
    from rdpp_cli.metrics.cider import DocFreq
    from rdpp_cli.metrics.train_cider import TrainCider

    torch.manual_seed(0)
    model = Att2in(config_from_preset("paper", VOCAB, ATT_DIM, ATT_DIM, MAX_LEN)).to(device).eval()
    batch = 50  # rdpp sample's --batch-size
    att = torch.randn(batch, REGIONS, ATT_DIM, device=device).relu_()
    sizes = [min(batch, images - s) for s in range(0, images, batch)]
    cfg = DecodeConfig(method="random", n=C, max_len=MAX_LEN).check()
    gen = torch.Generator(device=device).manual_seed(0)
    drawn: list = []

    def draw():
        drawn.clear()
        for b in sizes:
            drawn.append(decode(model, None, att[:b], cfg, generator=gen))
        if device.type == "cuda":
            torch.cuda.synchronize()

    variants = [("dpp", "consensus"), ("dpp", "logprob"), ("mbr", None), ("logprob", None)]

    scorer = TrainCider(DocFreq.from_h5(df_path), VOCAB + 1, MAX_LEN, MAX_LEN)  # what rdpp sample builds

    def choose(method, quality):
        sel = SelectConfig(method, C, quality).check(K)
        return lambda: [select(d.tokens, d.seq_logprob, d.lengths, K, sel, scorer) for d in drawn]

    draw()  # warm-up; also the captions every selection runs on
    kernels = []
    for d in drawn:
        q, S = _cider_terms(d.tokens.cpu().numpy(), scorer)
        kernels.append(torch.from_numpy(S * q[:, :, None] * q[:, None, :]))
    ours = lambda: [greedy_map(L, K) for L in kernels]  # noqa: E731
    ref = lambda: [[ref_greedy_map(L_b, K) for L_b in L.numpy()] for L in kernels]  # noqa: E731
    got, want = torch.cat(ours()).tolist(), [r for rs in ref() for r in rs]
    assert got == want, "batched greedy MAP chose other items than the per-image reference"
    fns = {"draw": draw, **{f"{m}-{q}" if q else m: choose(m, q) for m, q in variants}, "greedy": ours, "ref": ref}
    for fn in fns.values():
        if fn is not draw:
            fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):  # interleaved
        for name, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[name].append(CLOCK() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    rows = [{"device": device.type, "what": f"draw {C} random samples per image (decode)", "images": images,
             "seconds": round(med["draw"], 4), "ms_per_image": round(1e3 * med["draw"] / images, 3), "vs_draw": 1.0}]
    for name in [k for k in fns if k not in ("draw", "greedy", "ref")]:
        rows.append({"device": device.type, "what": f"select {K} of {C}: {name} (kernel + choice, CPU)",
                     "images": images, "seconds": round(med[name], 4),
                     "ms_per_image": round(1e3 * med[name] / images, 3),
                     "vs_draw": round(med[name] / med["draw"], 4)})
    rows.append({"device": device.type, "what": f"greedy MAP step alone, batched ({K} of {C})", "images": images,
                 "seconds": round(med["greedy"], 4), "ms_per_image": round(1e3 * med["greedy"] / images, 4),
                 "vs_draw": round(med["greedy"] / med["draw"], 5),
                 "reference": "per-image numpy loop (Chen et al.)", "ref_seconds": round(med["ref"], 4),
                 "speedup": round(med["ref"] / med["greedy"], 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=10, help="images per decode call")
    ap.add_argument("--n", type=int, default=20, help="captions per image for the sampling methods")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu,cuda", help="comma list; cuda is skipped without a GPU")
    ap.add_argument("--no-ref", action="store_true", help="skip the references")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (all threads), steadier than wall time on a shared machine")
    ap.add_argument("--sections", default="decode,select", help="comma list of: decode, select")
    ap.add_argument("--select-images", type=int, default=5000, help="images of the selection section")
    ap.add_argument("--candidates", type=int, default=50, help="C: samples drawn per image for selection")
    ap.add_argument("--keep", type=int, default=5, help="K: captions selected per image")
    ap.add_argument("--df", default=None, help="a cider_df.h5 (default: a synthetic COCO-sized one)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    rows, sel_rows = [], []
    df_dir = None
    if "select" in sections and args.df is None:
        import tempfile
        from pathlib import Path

        df_dir = tempfile.TemporaryDirectory(prefix="rdpp-bench-df-")
        args.df = _zipf_df(Path(df_dir.name) / "cider_df.h5")
    for dev in args.device.split(","):
        if dev == "cuda" and not torch.cuda.is_available():
            continue
        if "decode" in sections:
            rows += run(torch.device(dev), args.batch, args.n, args.repeats, not args.no_ref)
        if "select" in sections:
            sel_rows += run_select(torch.device(dev), args.select_images, args.candidates, args.keep,
                                   max(args.repeats, 3), args.df)

    from rich.console import Console
    from rich.table import Table

    if sel_rows:
        t = Table(title=f"rdpp sample --select: {args.keep} of {args.candidates} per image, {args.select_images} "
                        f"images (paper preset, random weights; medians of {max(args.repeats, 3)} interleaved runs, "
                        f"CPU threads {args.threads}, {args.clock} clock)", title_justify="left")
        for col in ("device", "what", "s", "ms/image", "x draw", "reference s", "speedup"):
            t.add_column(col, justify="left" if col in ("device", "what") else "right")
        for r in sel_rows:
            t.add_row(r["device"], r["what"], f"{r['seconds']:.3f}", f"{r['ms_per_image']:.3f}", f"{r['vs_draw']:.4f}",
                      f"{r['ref_seconds']:.3f}" if "reference" in r else "-",
                      f"{r['speedup']:.1f}x" if "reference" in r else "-")
        Console(width=170).print(t)
    if df_dir is not None:
        df_dir.cleanup()
    if not rows:
        if args.json:
            print(json.dumps({"benchmark": "sample", "threads": args.threads, "clock": args.clock,
                              "select_rows": sel_rows}))
        return

    table = Table(title=f"rdpp decoding speed (paper preset, vocab {VOCAB}, {REGIONS}x{ATT_DIM} att, "
                        f"{args.batch} images, CPU threads {args.threads}, {args.clock} clock)", title_justify="left")
    for col in ("device", "method", "captions", "s", "captions/s", "reference", "ref captions/s", "speedup"):
        table.add_column(col, justify="right" if col not in ("device", "method", "reference") else "left")
    for r in rows:
        table.add_row(r["device"], r["method"], str(r["captions"]), f"{r['seconds']:.3f}", f"{r['captions_per_s']:,.1f}",
                      r.get("reference", "-"), f"{r['ref_captions_per_s']:,.1f}" if "reference" in r else "-",
                      f"{r['speedup']:.2f}x" if "reference" in r else "-")
    Console(width=150).print(table)
    if args.json:
        print(json.dumps({"benchmark": "sample", "threads": args.threads, "batch": args.batch, "clock": args.clock,
                          "rows": rows, "select_rows": sel_rows}))


if __name__ == "__main__":
    main()
