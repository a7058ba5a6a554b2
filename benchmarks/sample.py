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
- beam search and DBS: the arithmetic as above (the peer's ``_forward`` on rdpp's beams); the
  replica below (``Upstream``: the peer's ``_sample_beam`` + ``beam_search`` written again, with
  the same repair) returns the peer's own ``done_beams`` bit for bit on every image; the replica
  driven by rdpp's step (so that a float-rounding difference cannot decide between two near-equal
  candidates) returns rdpp's captions, per-word log-probs and (beam search) scores on every image
  where no beam ended before the length limit and no two candidates tied at the cut (beam search
  is defined only up to the order of equal candidates, and with random weights exact float ties do
  occur). The note also says on how many images the peer's own beams, and its best caption, are
  rdpp's.

Where the peer's beam search differs from rdpp's, by design (docs/decoding.md), nothing is compared:
the peer sets a finished caption aside and keeps ``beam_size`` live beams where rdpp keeps it in
its beam with a frozen score; a caption that reaches the limit ends in the peer without an EOS where
rdpp forces the EOS and counts its log-prob (compared: the score less that EOS); and the peer's DBS
staggers the groups (group g runs g steps behind group 0 and penalises the words at the same
position of the earlier groups' beams as they stand *then*, after those beams were re-ranked), where
rdpp penalises the words the earlier groups chose at the same step (Vijayakumar et al.'s
Algorithm 1). The two agree when each group has one beam (rdpp's default, n groups of 1); with
more beams per group only group 0 is compared.

Both sides run ``--repeats`` times, interleaved (benchmarks/timing.py), after the untimed check run
of each; the table gives medians (bests beside) and the ratio of the medians. The peer's checkout:
``--peer-repo``, else ``$SCP_REPO``, else the project's copy (benchmarks/peer.py); ``--no-ref``
times rdpp alone.

    python benchmarks/sample.py [--json] [--threads 2] [--batch 10] [--n 20] [--repeats 3] [--device cpu,cuda]
                                [--clock wall|cpu] [--peer-repo PATH] [--no-ref] [--sections decode,select]
                                [--select-images 5000] [--candidates 50] [--keep 5] [--df cider_df.h5]

Selection section (``rdpp sample --select``): choosing ``--keep`` (5) of ``--candidates`` (50) random
samples per image for ``--select-images`` (5,000) images, against drawing those 50 samples
(``decode``, method random, batches of 50 images as ``rdpp sample``), timed interleaved, medians of
``--repeats`` (at least 3); the selection runs on the drawn captions, with the CIDEr-D document
frequencies of ``--df`` (default: a synthetic Zipf set of 20,000 images, ~2M n-grams, the size of
COCO's). The greedy MAP step alone is also timed against a per-image numpy loop of Chen et al.'s
algorithm, checked to choose the same items first. It has no peer.
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
from timing import interleaved, machine  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.att2in import Att2in, config_from_preset, sequence_logprobs  # noqa: E402

VOCAB, REGIONS, ATT_DIM, MAX_LEN = 9487, 196, 2048, 16
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


# -- a replica of the peer's beam search: a correctness check only, never timed ---------------------

def repeat_tensors(n: int, x):
    """models/utils.py: each row of (B, ...) n times -> (B*n, ...), a copy (expand, then reshape)."""
    if torch.is_tensor(x):
        return x.unsqueeze(1).expand(-1, n, *x.shape[1:]).reshape(x.shape[0] * n, *x.shape[1:])
    return [repeat_tensors(n, y) for y in x]


def split_tensors(n: int, x):
    """models/utils.py: (B*n, ...) -> n views (B, ...), row i of view j is row i*n + j."""
    if torch.is_tensor(x):
        return x.reshape(x.shape[0] // n, n, *x.shape[1:]).unbind(1)
    return [split_tensors(n, y) for y in x]


class Upstream:
    """self-critical.pytorch's ``_sample_beam`` + ``beam_search`` (Att2in2Model, eval mode) written
    again on ``model``'s weights, the same operations in the same order (it returns the peer's
    ``done_beams`` bit for bit; ``check`` verifies it), so that the checks can see what the peer
    hides: which images had a beam end early, ties at the cut, and the search driven by rdpp's step."""

    def __init__(self, model: Att2in, seq_length: int, rdpp_step=None) -> None:
        self.m, self.L = model, seq_length
        self.H, self.V1 = model.config.rnn_size, model.config.vocab_size + 1
        self.early_ends: list[int] = []  # captions that ended before the limit, per image
        self.ties = None  # and (``rdpp_step`` only) whether two candidates tied at the beam's cut, per image
        # ``rdpp_step=att`` replaces the step's arithmetic by rdpp's ``Att2in.step`` on those images
        # (rows image-major), to compare the search algorithms alone
        self.enc = None if rdpp_step is None else model.encode(rdpp_step)

    # AttModel._prepare_feature (Att2in2: fc_embed is the identity and unused)
    def prepare(self, att):
        a = F.relu(self.m.att_embed(att))
        return a, self.m.ctx2att(a)

    def init_hidden(self, n: int):
        w = self.m.h2h.weight
        return w.new_zeros(1, n, self.H), w.new_zeros(1, n, self.H)

    # AttModel.get_logprobs_state with Att2in2Core and Attention
    def get_logprobs_state(self, it, att_feats, p_att_feats, state):
        m, H = self.m, self.H
        if self.enc is not None:
            lp, (h, c) = m.step(it, m.expand(self.enc, it.shape[0] // self.enc.att.shape[0]),
                                (state[0][-1], state[1][-1]))
            return lp, (h.unsqueeze(0), c.unsqueeze(0))
        xt = F.relu(m.embed(it))
        h, c = state[0][-1], state[1][-1]
        R, A = p_att_feats.shape[-2], p_att_feats.shape[-1]
        att = p_att_feats.view(-1, R, A)
        dot = torch.tanh(att + m.h2att(h).unsqueeze(1).expand_as(att))
        weight = F.softmax(m.alpha_net(dot.view(-1, A)).view(-1, R), dim=1)
        att_res = torch.bmm(weight.unsqueeze(1), att_feats.view(-1, R, att_feats.shape[-1])).squeeze(1)
        sums = m.i2h(xt) + m.h2h(h)
        gates = torch.sigmoid(sums.narrow(1, 0, 3 * H))
        cell_in = sums.narrow(1, 3 * H, 2 * H) + m.a2c(att_res)
        cell_in = torch.max(cell_in.narrow(1, 0, H), cell_in.narrow(1, H, H))
        c = gates.narrow(1, H, H) * c + gates.narrow(1, 0, H) * cell_in
        h = gates.narrow(1, 2 * H, H) * torch.tanh(c)
        return F.log_softmax(m.logit(h), dim=1), (h.unsqueeze(0), c.unsqueeze(0))

    # AttModel._sample_beam: one BOS step per image, then the search over beam_size copies
    def sample_beam(self, att, beam_size: int, group_size: int = 1, diversity_lambda: float = 0.5) -> list:
        B = att.shape[0]
        a, p = self.prepare(att)
        state = self.init_hidden(B)
        logprobs, state = self.get_logprobs_state(att.new_full((B,), BOS, dtype=torch.long), a, p, state)
        a, p = repeat_tensors(beam_size, [a, p])
        self.done_beams = self.beam_search(state, logprobs, [a, p], beam_size, group_size, diversity_lambda)
        return self.done_beams
    # CaptionModel.beam_search (batched; diverse when group_size > 1; no length penalty)
    def beam_search(self, init_state, init_logprobs, args, beam_size: int, group_size: int, lam: float,
                    temperature: float = 1.0):
        G, bdash, L, V1 = group_size, beam_size // group_size, self.L, self.V1
        B, dev = init_logprobs.shape[0], init_logprobs.device
        seqs = [torch.zeros(B, bdash, 0, dtype=torch.long, device=dev) for _ in range(G)]
        seq_lps = [torch.zeros(B, bdash, 0, V1, device=dev) for _ in range(G)]
        sums = [torch.zeros(B, bdash, device=dev) for _ in range(G)]
        done = [[[] for _ in range(G)] for _ in range(B)]
        self.ties = torch.zeros(B, dtype=torch.bool, device=dev)
        states = [[s.clone() for s in init_state] for _ in range(G)]
        logprobs_g = [init_logprobs.clone() for _ in range(G)]
        per_group = split_tensors(G, args)
        per_group = [[per_group[i][g] for i in range(len(args))] for g in range(G)]

        def add_diversity(logprobs, lt: int, g: int):
            unaug = logprobs.clone()
            if g > 0:
                change = logprobs.new_zeros(B, logprobs.shape[-1])
                for prev in range(g):
                    words = seqs[prev][:, :, lt]
                    for j in range(bdash):
                        change.scatter_add_(1, words[:, j].unsqueeze(-1), change.new_ones(B, 1))
                logprobs = logprobs - (change if lt == 0 else repeat_tensors(bdash, change)) * lam
            return logprobs, unaug

        def beam_step(logprobs, unaug, lt: int, seq, seq_lp, lp_sum, state):
            logprobs = logprobs.reshape(B, -1, V1)
            if lt == 0:
                lp_sum = lp_sum[:, :1]
            cand = (lp_sum.unsqueeze(-1) + logprobs).reshape(B, -1)
            ys, ix = torch.sort(cand, -1, True)
            if self.enc is not None and ys.shape[1] > bdash:  # checks only: equal candidates at the cut
                self.ties |= ys[:, bdash - 1] == ys[:, bdash]
            ys, ix = ys[:, :bdash], ix[:, :bdash]
            beam_ix, word = ix // V1, ix % V1
            state_ix = (beam_ix + torch.arange(B, device=dev).unsqueeze(-1) * logprobs.shape[1]).reshape(-1)
            if lt > 0:
                assert (seq.gather(1, beam_ix.unsqueeze(-1).expand_as(seq))
                        == seq.reshape(-1, seq.shape[-1])[state_ix].view_as(seq)).all()
                seq = seq.gather(1, beam_ix.unsqueeze(-1).expand_as(seq))
                seq_lp = seq_lp.gather(1, beam_ix.unsqueeze(-1).unsqueeze(-1).expand_as(seq_lp))
            seq = torch.cat([seq, word.unsqueeze(-1)], -1)
            lp_sum = lp_sum.gather(1, beam_ix) + logprobs.reshape(B, -1).gather(1, ix)
            assert (lp_sum == ys).all()
            chosen = unaug.reshape(B, -1, V1).gather(1, beam_ix.unsqueeze(-1).expand(-1, -1, V1))
            assert (unaug[state_ix].reshape(B, -1, V1) == chosen).all()
            seq_lp = torch.cat([seq_lp, chosen.reshape(B, -1, 1, V1)], 2)
            return seq, seq_lp, lp_sum, [s[:, state_ix] for s in state]

        for t in range(L + G - 1):
            for g in range(G):
                lt = t - g  # this group's own time step: group g runs g steps behind group 0
                if not 0 <= lt <= L - 1:
                    continue
                logprobs, unaug = add_diversity(logprobs_g[g], lt, g)
                seqs[g], seq_lps[g], sums[g], states[g] = beam_step(
                    logprobs, unaug, lt, seqs[g], seq_lps[g], sums[g], states[g])
                for b in range(B):  # finished (or out of time): set aside, and out of the live beams
                    is_end = seqs[g][b, :, lt] == EOS
                    assert seqs[g].shape[-1] == lt + 1
                    if lt == L - 1:
                        is_end.fill_(1)
                    for v in range(bdash):
                        if is_end[v]:
                            done[b][g].append({"seq": seqs[g][b, v].clone(), "logps": seq_lps[g][b, v].clone(),
                                               "unaug_p": seq_lps[g][b, v].sum().item(),
                                               "p": sums[g][b, v].item()})
                    sums[g][b, is_end] -= 1000
                it = seqs[g][:, :, lt].reshape(-1)
                logprobs_g[g], states[g] = self.get_logprobs_state(it, *per_group[g], states[g])
                logprobs_g[g] = F.log_softmax(logprobs_g[g] / temperature, dim=-1)
        self.early_ends = [sum(len(d) for d in done[b]) - G * bdash for b in range(B)]
        return [sum((sorted(done[b][g], key=lambda x: -x["p"])[:bdash] for g in range(G)), []) for b in range(B)]


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


def compare_beams(up: Upstream, ours, G: int, K: int, groups: list[int]) -> tuple[int, list[int], float]:
    """Images compared (those where no beam ended before the limit on either side, and, where ``up``
    recorded them, no two candidates tied at the cut: beam search's result is defined only up to
    the order of equal candidates), those whose captions differ in one of ``groups``, and the
    largest difference on the others: of a word's log-prob, or (beam search) of a beam's score
    relative to its size, divided by 10 (a sum of 16 float32 log-probs of ~9 each, in another order)."""
    B, n, L = ours.tokens.shape[0], ours.tokens.shape[1], up.L
    full = (ours.lengths == L).all(1).tolist()
    tied = up.ties.tolist() if up.enc is not None else [False] * B
    compared, differ, d = 0, [], 0.0
    for b in range(B):
        if up.early_ends[b] or not full[b] or tied[b]:
            continue
        compared += 1
        for g in groups:
            theirs = {tuple(x["seq"].tolist()): x for x in up.done_beams[b][g * K:(g + 1) * K]}
            rows = [k * G + g for k in range(K) if k * G + g < n]  # rdpp's order: rank-major over groups
            mine = {tuple(ours.tokens[b, r].tolist()): r for r in rows}
            if set(mine) != set(theirs):
                differ.append(b)
                break
            for words, r in mine.items():
                x = theirs[words]
                lp = x["logps"].gather(1, x["seq"].unsqueeze(1)).squeeze(1)
                d = max(d, (lp - ours.logprobs[b, r, :L]).abs().max().item())
                if G == 1:  # the beam's score: rdpp's, less the EOS it forces at the limit
                    score = (ours.seq_logprob[b, r] - ours.logprobs[b, r, L]).item()
                    d = max(d, abs(x["p"] - score) / max(abs(score), 1.0) / 10)
    return compared, differ, d


def first_step_logprobs(model: Att2in, att, n: int):
    """rdpp's log-probs (B*n, V+1) of the first word, ``Att2in.step`` from BOS as ``decode`` starts."""
    N = att.shape[0] * n
    lp, _ = model.step(torch.full((N,), BOS, dtype=torch.long, device=att.device),
                       model.expand(model.encode(att), n), model.init_state(N))
    return lp.float()


def same_beams(a: list, b: list) -> bool:
    """Two ``done_beams`` (per image, a list of {'seq', 'logps', 'p', ...}) equal bit for bit."""
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(u["seq"], v["seq"]) and torch.equal(u["logps"], v["logps"])
                                 and u["p"] == v["p"] for u, v in zip(x, y)) for x, y in zip(a, b))


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
    return _check_beams(name, model, ref, att, cfg, ours, d)


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


def _check_beams(name: str, model: Att2in, ref: PeerDecoding, att, cfg: DecodeConfig, ours, d: float) -> str:
    """Beam search and DBS: the replica returns the peer's own beams; the replica's search driven by
    rdpp's step (the same arithmetic, so that float-rounding near-ties cannot flip a beam) returns
    rdpp's beams wherever the two algorithms are the same (see the docstring)."""
    B = ours.tokens.shape[0]
    G = cfg.groups if cfg.method == "dbs" else 1
    K = cfg.beam
    groups = list(range(G)) if G == 1 or K == 1 else [0]  # see the docstring: DBS with K > 1 is staggered upstream
    up = Upstream(model, MAX_LEN)
    if not same_beams(up.sample_beam(att, K * G, G, cfg.diversity_lambda), ref.model.done_beams):
        raise SystemExit(f"{name}: the peer's own beam search and its replica (Upstream, on rdpp's weights) "
                         "return different beams; not timed")
    literal = compare_beams(up, ours, G, K, groups)  # the peer's own beams (the replica's early ends)
    best = sum(_words(ref.model.done_beams[b][0]["seq"]) == _words(ours.tokens[b, 0]) for b in range(B))
    alg = Upstream(model, MAX_LEN, rdpp_step=att)
    alg.sample_beam(att, K * G, G, cfg.diversity_lambda)
    compared, differ, d2 = compare_beams(alg, ours, G, K, groups)
    if compared == 0:
        raise SystemExit(f"{name}: every image had a beam that ended early or a tie, nothing to compare; "
                         "use more --batch")
    if differ:
        raise _mismatch(name, f"captions of image {differ[0]}")
    if not max(d, d2) <= TOL:
        raise _mismatch(name, f"log-probs or scores by {max(d, d2):.1e} (see compare_beams)")
    which = "" if groups == list(range(G)) else ", group 0"
    return (f"{compared}/{B} images (no early end, no tie){which}: the search on rdpp's step gives rdpp's "
            f"captions, log-probs within {max(d, d2):.0e}; the peer's own beams: "
            f"{literal[0] - len(literal[1])}/{literal[0]} the same set, {best}/{B} the same first caption"
            + (" (the peer ranks a caption cut at the limit without the EOS rdpp counts)" if best < B else ""))


def run(device: torch.device, batch: int, n: int, repeats: int, mods: peer.Modules | None, clock) -> list[dict]:
    torch.manual_seed(0)
    model = Att2in(config_from_preset("paper", VOCAB, ATT_DIM, MAX_LEN)).to(device).eval()
    att = torch.randn(batch, REGIONS, ATT_DIM, device=device).relu_()
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


CLOCK = time.perf_counter  # --clock (the selection section reads it)


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
    model = Att2in(config_from_preset("paper", VOCAB, ATT_DIM, MAX_LEN)).to(device).eval()
    batch = 50  # rdpp sample's --batch-size
    att = torch.randn(batch, REGIONS, ATT_DIM, device=device).relu_()
    sizes = [min(batch, images - s) for s in range(0, images, batch)]
    cfg = DecodeConfig(method="random", n=C, max_len=MAX_LEN).check()
    gen = torch.Generator(device=device).manual_seed(0)
    drawn: list = []

    def draw():
        drawn.clear()
        for b in sizes:
            drawn.append(decode(model, att[:b], cfg, generator=gen))
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
    ap.add_argument("--n", type=int, default=20, help="captions per image (sampling, beam search, DBS)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each side (selection: at least 3)")
    ap.add_argument("--device", default="cpu,cuda", help="comma list; cuda is skipped without a GPU")
    ap.add_argument("--no-ref", "--no-reference", dest="no_ref", action="store_true",
                    help="time rdpp alone (no peer; the selection section's numpy reference still runs)")
    ap.add_argument("--peer-repo", default=None,
                    help="self-critical.pytorch checkout (default: $SCP_REPO, then the project's copy of 4c48a33)")
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

        df_dir = tempfile.TemporaryDirectory(prefix="rdpp-bench-df-")
        args.df = _zipf_df(Path(df_dir.name) / "cider_df.h5")
    mods = None
    if "decode" in sections and not args.no_ref:
        mods = peer.modules(peer.find_repo(args.peer_repo))
    for dev in args.device.split(","):
        if dev == "cuda" and not torch.cuda.is_available():
            continue
        if "decode" in sections:
            rows += run(torch.device(dev), args.batch, args.n, args.repeats, mods, CLOCK)
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

    print_decode_table(rows, args, mods)
    if args.json:
        print(json.dumps({"benchmark": "sample", "threads": args.threads, "batch": args.batch, "clock": args.clock,
                          "repeats": args.repeats, "machine": machine(),
                          "reference": None if mods is None else f"self-critical.pytorch's own code at {mods.repo}",
                          "rows": rows, "select_rows": sel_rows}))


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

