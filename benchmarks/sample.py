"""Decoding speed (captions/s) of every method at the paper's shapes, against self-critical.pytorch's
own decoding (its modules, unmodified, in the same process: benchmarks/peer.py) on the same weights.

Shapes: Att2in paper preset (512/512/512), COCO's vocabulary (9,487 words -> 9,488 logits), 14x14 =
196 att regions of 2,048 features, a batch of ``--batch`` images (10), captions of at most 16 words,
``--n`` (20) captions per image. Random weights: captions run to full length or close to it, which
is the slow case.

The reference is the peer's ``Att2in2Model`` (``captioning.models.setup``, ``--caption_model
att2in2``; the same parameters as rdpp's ``Att2in`` under other names) holding rdpp's weights, in
eval mode, called as its ``eval_utils.eval_split_n`` calls it, ``model(fc, att, None, opt=...,
mode='sample')``:

- greedy, random, top-k, nucleus: ``AttModel._sample`` with ``sample_method`` ``greedy``, ``sample``,
  ``top5`` (k = 5), ``top0.9`` (p = 0.9) and ``sample_n`` = n (``beam_size`` 1);
- beam search (``sample_n_method bs``: ``beam_size`` = n) and diverse beam search (G groups of K
  beams, ``sample_n_method dbs``: ``beam_size`` = G*K, ``group_size`` = G, ``diversity_lambda``):
  ``_sample_beam`` + ``CaptionModel.beam_search``, ``sample_n`` 1; its captions are the model's
  ``done_beams`` (K per group, each group's best first), where eval_split_n reads them.

One repair, applied at run time to the peer's model instance only when its code needs it: the
peer's ``add_diversity`` calls ``self.repeat_tensor(bdash, change)``, a method no model defines, so
its DBS stops with an AttributeError at the second step of its second group. The script runs the
peer's DBS once as written (one image, two groups); if it stops so, it sets the instance's
``repeat_tensor`` to the peer's own ``captioning.models.utils.repeat_tensors``, what the call
means (with one beam per group it returns ``change`` unchanged), and the table says so. Nothing
else of the peer is changed, and its files are only read.

Checked before timing, on the timed inputs (untimed runs, which are also the warm-ups); a failed
check stops the script:

- greedy: the peer's words are rdpp's on every image, with the same log-probs (to ``TOL``);
- random, top-k, nucleus (the two sides draw from different random streams, so not the same
  words): the first step's log-probs over the whole vocabulary, the peer's ``seqLogprobs[:, 0]``
  against rdpp's ``Att2in.step`` from BOS, on every row; the peer's teacher-forced ``_forward``
  gives rdpp's captions rdpp's log-probs (EOS included), and rdpp's forward gives the peer's
  captions the log-probs the peer recorded;
- beam search and DBS: the arithmetic as above (the peer's ``_forward`` on rdpp's beams). The
  searches themselves are set side by side, not required equal (float rounding may decide between
  near-equal candidates differently on the two sides, and the algorithms differ by design, below):
  the note says on how many images whose kept beams all run to the length limit the peer's own
  beams are rdpp's set, and on how many images its best caption is rdpp's.

Where the peer's beam search differs from rdpp's, by design (docs/decoding.md):
the peer sets a finished caption aside and keeps ``beam_size`` live beams where rdpp keeps it in
its beam with a frozen score; a caption that reaches the limit ends in the peer without an EOS where
rdpp forces the EOS and counts its log-prob; and the peer's DBS
staggers the groups (group g runs g steps behind group 0 and penalises the words at the same
position of the earlier groups' beams as they stand *then*, after those beams were re-ranked), where
rdpp penalises the words the earlier groups chose at the same step (Vijayakumar et al.'s
Algorithm 1). The two agree when each group has one beam (rdpp's default, n groups of 1); with
more beams per group only group 0 is set beside rdpp's.

Both sides run ``--repeats`` times, interleaved (benchmarks/timing.py), after the untimed check run
of each; the table gives medians (bests beside) and the ratio of the medians. The peer's checkout:
``--peer-repo``, else ``$SCP_REPO``, else the project's copy (benchmarks/peer.py); ``--no-ref``
times rdpp alone.

    python benchmarks/sample.py [--json] [--threads 2] [--batch 10] [--n 20] [--repeats 3] [--device cpu,cuda]
                                [--clock wall|cpu] [--peer-repo PATH] [--no-ref]
    python benchmarks/sample.py --batch 2 --n 4 --repeats 1   # a quick check of every case

``rdpp sample --select`` against drawing is benchmarks/selection.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402
from common import ATT_DIM, REGIONS, SEQ_LEN as MAX_LEN, VOCAB, features, paper_model  # noqa: E402
from timing import interleaved, machine  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.att2in import Att2in, sequence_logprobs  # noqa: E402

EOS = PAD = BOS = 0  # self-critical.pytorch's defaults, and rdpp's


# -- the reference: self-critical.pytorch's own decoding, on an rdpp Att2in's weights -------------

REPAIR = ("add_diversity calls self.repeat_tensor, which no model defines: set on the instance to "
          "the peer's utils.repeat_tensors")


class PeerDecoding:
    """The peer's own ``Att2in2Model`` (benchmarks/peer.py) with ``model``'s weights, in eval mode,
    and its decoding calls; ``repair`` says whether its DBS needed the repair (the docstring)."""

    def __init__(self, mods: peer.Modules, model: Att2in, att) -> None:
        self.model = peer.Peer(mods, model, seq_per_img=1).model.eval()
        self.fc = att.mean(1)  # Att2in2 never reads its fc features (fc_embed is the identity); _sample sizes by them
        self.repair = self._repair_dbs(att)

    def _repair_dbs(self, att) -> str | None:
        """Run the peer's DBS as written (one image, two groups of one beam); if it stops at the
        missing ``repeat_tensor``, give the instance that name for the peer's ``repeat_tensors``."""
        try:
            with torch.no_grad():
                self.model(self.fc[:1], att[:1], None, opt={"beam_size": 2, "group_size": 2, "sample_n": 1},
                           mode="sample")
        except AttributeError as e:
            if "repeat_tensor" not in str(e):
                raise
            self.model.repeat_tensor = importlib.import_module("captioning.models.utils").repeat_tensors
            return REPAIR
        return None

    @staticmethod
    def opt(cfg: DecodeConfig) -> dict:
        """The peer's options for one case, as its eval_utils.eval_split_n sets them."""
        if cfg.method in ("beam", "dbs"):
            G = cfg.groups if cfg.method == "dbs" else 1
            o = {"beam_size": cfg.beam * G, "group_size": G, "sample_n": 1}
            return {**o, "diversity_lambda": cfg.diversity_lambda} if G > 1 else o
        method = {"greedy": "greedy", "random": "sample", "topk": f"top{cfg.top_k}",
                  "nucleus": f"top{cfg.top_p}"}[cfg.method]
        return {"sample_method": method, "sample_n": cfg.n, "beam_size": 1, "temperature": cfg.temperature}

    def call(self, att, cfg: DecodeConfig):
        """The timed call: (seq, seqLogprobs); beam search's captions are in ``self.model.done_beams``."""
        o = self.opt(cfg)
        return lambda: self.model(self.fc, att, None, opt=o, mode="sample")

    def describe(self, cfg: DecodeConfig) -> str:
        fn = "_sample_beam + beam_search" if cfg.method in ("beam", "dbs") else "_sample"
        return f"{fn}({', '.join(f'{k}={v!r}' for k, v in self.opt(cfg).items())})"

    def forward(self, att, seq):
        """The peer's teacher-forced ``_forward`` on word ids (N, L): log-probs (N, L+1, V+1)."""
        return self.model(self.fc, att, torch.cat([seq.new_full((seq.shape[0], 1), BOS), seq], 1), mode="forward")


# -- the cases, and the checks that both sides compute the same --------------------------------------

def cases(n: int) -> list[tuple[str, DecodeConfig]]:
    """Every method at n captions per image (beam search also at width 3, one caption per beam)."""
    k = max(n // 4, 1)  # DBS: 4 groups of n/4 beams, and rdpp's default, n groups of one beam
    kws = [dict(method="greedy", n=1), dict(method="random", n=n), dict(method="topk", n=n, top_k=5),
           dict(method="nucleus", n=n, top_p=0.9), dict(method="beam", n=3, beam=3), dict(method="beam", n=n, beam=n),
           dict(method="dbs", n=min(n, 4 * k), beam=k, groups=4), dict(method="dbs", n=n, beam=1, groups=n)]
    out = []
    for kw in kws:
        cfg = DecodeConfig(max_len=MAX_LEN, diversity_lambda=0.5, **kw).check()
        extra = {"topk": f" k={cfg.top_k}", "nucleus": f" p={cfg.top_p}", "beam": f" {cfg.beam}",
                 "dbs": f" {cfg.groups}x{cfg.beam}"}.get(cfg.method, "")
        name = f"{cfg.method}{extra} (n={cfg.n})"
        if name not in dict(out):  # (at small n the two DBS shapes coincide)
            out.append((name, cfg))
    return out


TOL = 1e-4  # log-probs: the two attention forms differ by float rounding (rdpp's tanh via sigmoid)


def _mismatch(name: str, what: str) -> SystemExit:
    return SystemExit(f"{name}: self-critical.pytorch's code and rdpp differ ({what}); not timed")


def _ref_word_logprobs(seq, seq_logprobs):
    """Log-prob of each recorded token (words and an EOS before the limit), and their mask."""
    lp = seq_logprobs.gather(2, seq.unsqueeze(2)).squeeze(2)
    is_eos = (seq == EOS).int()
    return lp, (is_eos.cumsum(1) - is_eos) == 0


def first_step_logprobs(model: Att2in, att, n: int):
    """rdpp's log-probs (B*n, V+1) of the first word, ``Att2in.step`` from BOS as ``decode`` starts."""
    N = att.shape[0] * n
    lp, _ = model.step(torch.full((N,), BOS, dtype=torch.long, device=att.device),
                       model.expand(model.encode(att), n), model.init_state(N))
    return lp.float()


def _words(seq) -> list[int]:
    """A caption's words, up to its first EOS."""
    words = seq.tolist()
    return words[:words.index(EOS)] if EOS in words else words


def check(name: str, model: Att2in, ref: PeerDecoding, att, cfg: DecodeConfig, ours, theirs) -> str:
    """Raise SystemExit unless rdpp's output ``ours`` and the peer's ``theirs`` (its call's
    (seq, seqLogprobs); beam search: also its model's ``done_beams``) agree where the two algorithms
    are the same; return a note of what was compared."""
    B, n, T = ours.tokens.shape
    seq, seq_lp = theirs
    L = MAX_LEN
    tok = F.pad(ours.tokens, (0, L - T)).view(B * n, L)  # rdpp's words, padded to the limit
    ours_lp = F.pad(ours.logprobs, (0, L - T)).view(B * n, L + 1)  # and their log-probs (EOS included)
    if cfg.method == "greedy":
        if not torch.equal(tok, seq):
            raise _mismatch(name, "greedy words")
        lp, mask = _ref_word_logprobs(seq, seq_lp)
        d = (lp - ours_lp[:, :L])[mask].abs().max().item()
        if not d <= TOL:
            raise _mismatch(name, f"greedy log-probs by {d:.1e}")
        return f"same words, log-probs within {d:.0e}"
    # the arithmetic: the peer's teacher-forced _forward gives rdpp's captions rdpp's log-probs (EOS included)
    lp, mask = sequence_logprobs(ref.forward(att, tok), tok)
    d = ((lp - ours_lp) * mask).abs().max().item()
    if cfg.method in ("random", "topk", "nucleus"):
        return _check_sampling(name, model, att, n, seq, seq_lp, d)
    if not d <= TOL:
        raise _mismatch(name, f"log-probs of rdpp's beams by {d:.1e}")
    return _check_beams(name, ref, cfg, ours, d)


def _check_sampling(name: str, model: Att2in, att, n: int, seq, seq_lp, d: float) -> str:
    """Sampling (different random streams on the two sides): the first step's whole log-prob table,
    and rdpp's forward on the peer's captions against the log-probs the peer recorded."""
    B, L = att.shape[0], MAX_LEN
    d0 = (seq_lp[:, 0] - first_step_logprobs(model, att, n)).abs().max().item()
    if not d0 <= TOL:
        raise _mismatch(name, f"the first step's log-probs by {d0:.1e}")
    lp_r, mask_r = _ref_word_logprobs(seq, seq_lp)
    tf_lp, _ = sequence_logprobs(model(att, seq.view(B, n, L)), seq)
    d = max(d, (lp_r - tf_lp[:, :L])[mask_r].abs().max().item())
    if not d <= TOL:
        raise _mismatch(name, f"log-probs of the same captions by {d:.1e}")
    return (f"first step's log-probs ({seq_lp.shape[0]} rows x {seq_lp.shape[2]} words) within {d0:.0e}; "
            f"each side's captions get the same log-probs from the other (within {d:.0e})")


def _check_beams(name: str, ref: PeerDecoding, cfg: DecodeConfig, ours, d: float) -> str:
    """Beam search and DBS: the arithmetic is checked (``d``: the peer's ``_forward`` on rdpp's
    beams). The searches differ by design where a caption ends before the limit (see the
    docstring), so the peer's own beams are set beside rdpp's, not required to be equal: on how many
    images whose kept beams all run to the limit on both sides they are rdpp's set (each group, or
    group 0 where the peer staggers groups of several beams), and on how many the first caption is."""
    B, n, L = ours.tokens.shape[0], ours.tokens.shape[1], MAX_LEN
    G = cfg.groups if cfg.method == "dbs" else 1
    K = cfg.beam
    groups = list(range(G)) if G == 1 or K == 1 else [0]
    done = ref.model.done_beams
    full = [b for b in range(B) if (ours.lengths[b] == L).all() and not any(EOS in x["seq"].tolist() for x in done[b])]
    same = 0
    for b in full:
        rows = [[k * G + g for k in range(K) if k * G + g < n] for g in groups]  # rdpp's order: rank-major
        same += all({tuple(x["seq"].tolist()) for x in done[b][g * K:(g + 1) * K]}
                    == {tuple(ours.tokens[b, r].tolist()) for r in rs} for g, rs in zip(groups, rows))
    best = sum(_words(done[b][0]["seq"]) == _words(ours.tokens[b, 0]) for b in range(B))
    which = "" if groups == list(range(G)) else ", group 0"
    return (f"rdpp's beams get their log-probs from the peer's arithmetic (within {d:.0e}); the peer's own "
            f"beams: {same}/{len(full)} images with no early end the same set{which}, {best}/{B} the same first "
            "caption" + (" (the peer ranks a caption cut at the limit without the EOS rdpp counts)" if best < B else ""))


def run(device: torch.device, batch: int, n: int, repeats: int, mods: peer.Modules | None, clock) -> list[dict]:
    model = paper_model(device=device).eval()
    att = features(batch, torch.Generator().manual_seed(0)).to(device)
    ref = None if mods is None else PeerDecoding(mods, model, att)

    def synced(fn):
        if device.type != "cuda":
            return fn
        return lambda: (fn(), torch.cuda.synchronize())[0]

    rows = []
    with torch.no_grad():
        for name, cfg in cases(n):
            gen = torch.Generator(device=device).manual_seed(0)
            ours = synced(lambda: decode(model, att, cfg, generator=gen))
            row = {"device": device.type, "method": name, "images": batch, "captions": batch * cfg.n}
            fns = {"rdpp": ours}
            if ref is not None:
                theirs = synced(ref.call(att, cfg))
                torch.manual_seed(0)  # the peer samples from torch's global generator
                row["peer_call"] = ref.describe(cfg)
                if cfg.method == "dbs" and ref.repair:
                    row["peer_repair"] = ref.repair
                row["check"] = check(name, model, ref, att, cfg, ours(), theirs())  # also the warm-ups
                fns["reference"] = theirs
            else:
                ours()  # warm-up
            t = interleaved(fns, repeats, clock=clock)
            row.update(seconds=round(t["rdpp"].median, 4), best=round(t["rdpp"].best, 4),
                       captions_per_s=round(row["captions"] / t["rdpp"].median, 1))
            if ref is not None:
                r = t["reference"]
                row.update(ref_seconds=round(r.median, 4), ref_best=round(r.best, 4),
                           ref_captions_per_s=round(row["captions"] / r.median, 1),
                           speedup=round(r.median / t["rdpp"].median, 2),
                           speedup_best=round(r.best / t["rdpp"].best, 2))
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=10, help="images per decode call")
    ap.add_argument("--n", type=int, default=20, help="captions per image (sampling, beam search, DBS)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side")
    ap.add_argument("--device", default="cpu,cuda", help="comma list; cuda is skipped without a GPU")
    ap.add_argument("--no-ref", "--no-reference", dest="no_ref", action="store_true", help="time rdpp alone (no peer)")
    ap.add_argument("--peer-repo", default=None,
                    help="self-critical.pytorch checkout (default: $SCP_REPO, then the project's copy of 4c48a33)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (all threads), steadier than wall time on a shared machine")
    args = ap.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    mods = None if args.no_ref else peer.modules(peer.find_repo(args.peer_repo))
    rows = [r for dev in args.device.split(",") if dev != "cuda" or torch.cuda.is_available()
            for r in run(torch.device(dev), args.batch, args.n, args.repeats, mods, clock)]
    print_decode_table(rows, args, mods)
    if args.json:
        print(json.dumps({"benchmark": "sample", "threads": args.threads, "batch": args.batch, "clock": args.clock,
                          "repeats": args.repeats, "machine": machine(),
                          "reference": None if mods is None else f"self-critical.pytorch's own code at {mods.repo}",
                          "rows": rows}))


def print_decode_table(rows: list[dict], args, mods) -> None:
    from rich.console import Console
    from rich.table import Table

    ref = "self-critical.pytorch's own decoding (its Att2in2Model, same weights)" if mods else "no reference"
    table = Table(title=f"rdpp decoding vs {ref}: paper preset, vocab {VOCAB}, {REGIONS}x{ATT_DIM} att, "
                        f"{args.batch} images, {args.repeats} interleaved runs each, medians (bests), "
                        f"CPU threads {args.threads}, {args.clock} clock", title_justify="left")
    for col in ("device", "method", "captions", "rdpp s", "rdpp captions/s", "peer s", "peer captions/s",
                "speed-up (medians)", "(bests)", "the peer's call", "checked before timing"):
        table.add_column(col, justify="left" if col in ("device", "method", "the peer's call",
                                                        "checked before timing") else "right")
    for r in rows:
        ref = "ref_seconds" in r
        table.add_row(r["device"], r["method"], str(r["captions"]), f"{r['seconds']:.3f} ({r['best']:.3f})",
                      f"{r['captions_per_s']:,.1f}",
                      f"{r['ref_seconds']:.3f} ({r['ref_best']:.3f})" if ref else "-",
                      f"{r['ref_captions_per_s']:,.1f}" if ref else "-",
                      f"{r['speedup']:.2f}x" if ref else "-", f"{r['speedup_best']:.2f}x" if ref else "-",
                      r.get("peer_call", "-") + (" [repaired*]" if "peer_repair" in r else ""), r.get("check", "-"))
    con = Console(width=260)
    con.print(table)
    repaired = next((r["peer_repair"] for r in rows if "peer_repair" in r), None)
    if repaired:
        con.print(f"* the peer's DBS stops as written ({repaired}); nothing else of the peer is changed")
    if mods:
        con.print(f"peer: {mods.repo}")
    print(machine())


if __name__ == "__main__":
    main()

