"""CIDEr-D and self-CIDEr speed against pycocoevalcap's own code, in the same process, on the same captions.

Shapes: (a) corpus mode, 2,000 hypotheses x 5 references as strings; (b) the training-reward call
(250 samples against their references plus 50 5x5 sample-vs-sample matrices, token ids, a fixed
df swapped into pycocoevalcap's ``CiderScorer``; rdpp's one-pass and two-call forms; the same call
with a COCO-sized df, rdpp only); (c) self-CIDEr of ``--self-images`` x 20 captions, then rdpp
alone on 5,000 x 20. Both sides' results are checked to agree before anything is timed; each
shape runs both ``--repeat`` times, interleaved, medians (best beside). Captions: the 1,000-image
COCO fixture (tests/data/coco-val2014-1k). benchmarks/README.md ("metrics.py") says more.

    python benchmarks/metrics.py [--json] [--repeat 7] [--self-images 100]   # --json: only the JSON line
"""

from __future__ import annotations

import json
import random
import re
import resource
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, machine, parser, print_table  # noqa: E402

from rdpp_cli.metrics.cider import CiderD, DocFreq  # noqa: E402
from rdpp_cli.metrics.self_cider import self_cider_from_kernel  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "coco-val2014-1k" / "captions_val2014_1k.json"
T = 16  # caption length limit of the id shapes (the data stage's default)
M_SELF = 20  # captions per image for self-CIDEr


class FixedDfScorer(CiderScorer):
    """pycocoevalcap's CiderScorer with a fixed df and ref_len swapped in (its compute_cider
    would otherwise set ref_len = log(#entries))."""

    ref_len = property(lambda self: self._fixed_ref_len, lambda self, value: None)

    def __init__(self, document_frequency, ref_len: float) -> None:
        self._fixed_ref_len = ref_len
        super().__init__()
        self.document_frequency = document_frequency


def load_refs() -> list[list[str]]:
    ann = json.loads(FIXTURE.read_text())
    refs = defaultdict(list)
    for a in ann["annotations"]:
        refs[a["image_id"]].append(" ".join(re.sub(r"[^a-z0-9 ]", " ", a["caption"].lower()).split()))
    return [refs[i] for i in sorted(refs)]


def perturb(rng: random.Random, caption: str, vocab: list[str]) -> str:
    """A sample-like variant: drop, swap or replace a few words, maybe truncate."""
    w = caption.split()
    for _ in range(rng.randint(0, 3)):
        if not w:
            break
        op, i = rng.random(), rng.randrange(len(w))
        if op < 0.3:
            del w[i]
        elif op < 0.6:
            w[i] = rng.choice(vocab)
        else:
            j = rng.randrange(len(w))
            w[i], w[j] = w[j], w[i]
    return " ".join(w[: rng.randint(max(1, len(w) - 3), len(w))] if w else w)


def make_inputs(self_images: int = 5000, seed: int = 0) -> SimpleNamespace:
    """Every shape's captions, from one seeded generator (the same inputs on every run)."""
    rng = random.Random(seed)
    refs = load_refs()
    vocab = sorted({w for rs in refs for c in rs for w in c.split()})
    wid = {w: i + 1 for i, w in enumerate(vocab)}

    def ids(c: str) -> list[int]:
        return [wid[w] for w in c.split()][:T]

    # (a) corpus mode, strings
    R = [refs[k % len(refs)][:5] for k in range(2000)]
    H = [perturb(rng, rng.choice(refs[k % len(refs)]), vocab) if k % 3 else rng.choice(rng.choice(refs))
         for k in range(2000)]
    # (b) the reward call: df of an 800-image "training set", 50 other images x 5 samples
    train_ids = [[ids(c) for c in rs] for rs in refs[:800]]
    df = DocFreq.from_references(train_ids)
    padded = lambda caps: np.array([(ids(c) + [0] * T)[:T] for c in caps], np.int64)  # noqa: E731 -- (n, T)
    samples = np.stack([padded([perturb(rng, rng.choice(refs[i]), vocab) for _ in range(5)]) for i in range(800, 850)])
    ref_ids = np.stack([padded(refs[i][:5]) for i in range(800, 850)])
    # (c) self-CIDEr: images x 20 sample-like captions, each image's from one reference image's
    caps = np.stack([padded([perturb(rng, base[j % len(base)], vocab) for j in range(M_SELF)])
                     for base in (refs[rng.randrange(len(refs))] for _ in range(self_images))])
    return SimpleNamespace(refs=refs, vocab=vocab, R=R, H=H, train_ids=train_ids, df=df, samples=samples,
                           ref_ids=ref_ids, caps=caps)


def coco_sized(df: DocFreq, vocab_size: int, extra: int = 3_600_000) -> DocFreq:
    """``df`` plus random filler n-grams: a table of COCO's size (~3.6M n-grams), same df values."""
    frng = np.random.default_rng(1)
    order = frng.integers(2, 5, size=extra)
    filler = frng.integers(1, vocab_size + 1, size=(extra, 4))
    filler[np.arange(4)[None, :] >= order[:, None]] = 0
    grams, first = np.unique(np.concatenate([df.ngrams, filler]), axis=0, return_index=True)
    return DocFreq(grams, np.concatenate([df.df, np.ones(extra)])[first], df.num_docs)


def pyco_df(df: DocFreq) -> dict:
    """The same df as pycocoevalcap's ``document_frequency`` (n-grams of ids written as strings)."""
    out = defaultdict(float)
    for row, v in zip(df.ngrams, df.df):
        out[tuple(str(t) for t in row if t)] = v
    return out


def _as_str(a: np.ndarray) -> str:
    return " ".join(str(t) for t in a[a > 0])


def pyco_cider(samples: np.ndarray, ref_ids: np.ndarray | None, pdf: dict, ref_len: float) -> np.ndarray:
    """Per image: each sample vs its references (``ref_ids``, unless None), then the upper triangle of
    the sample kernel (sample i vs sample j, i <= j), all in one pycocoevalcap scorer: its scores, flat."""
    B, M, _ = samples.shape
    sc = FixedDfScorer(pdf, ref_len)
    for b in range(B):
        hs = [_as_str(s) for s in samples[b]]
        for j in range(M if ref_ids is not None else 0):
            sc.cook_append(hs[j], [_as_str(r) for r in ref_ids[b]])
        for i in range(M):
            for j in range(i, M):
                sc.cook_append(hs[i], [hs[j]])
    return np.array(sc.compute_cider())


def pyco_self_cider(caps: np.ndarray, pdf: dict, ref_len: float) -> np.ndarray:
    """Self-CIDEr as the authors' code computes it: CIDEr-D of c_i vs {c_j} pair by pair (i <= j,
    mirrored), then ``-log(sqrt(max sv) / sum sqrt(sv)) / log(m)`` of ``np.linalg.svd``."""
    B, M, _ = caps.shape
    flat = pyco_cider(caps, None, pdf, ref_len)
    iu = np.triu_indices(M)
    out = np.zeros(B)
    per = len(iu[0])
    for b in range(B):
        K = np.zeros((M, M))
        K[iu] = flat[b * per:(b + 1) * per]
        K = np.triu(K) + np.triu(K, 1).T
        s = np.linalg.svd(K, compute_uv=False)
        out[b] = -np.log(np.sqrt(s.max()) / np.sqrt(s).sum()) / np.log(M)
    return out


class Shapes:
    """The timed shapes, run in order; ``rows``: shape -> (label, pycocoevalcap timing or None, rdpp
    timing); ``diffs``: shape -> largest |rdpp - pycocoevalcap| on an untimed run, checked first."""

    def __init__(self, repeat: int):
        self.repeat, self.x = repeat, make_inputs()
        self.pdf, self.cd = pyco_df(self.x.df), CiderD(self.x.df)
        self.rows, self.diffs = {}, {}  # shape -> row; shape -> largest difference

    def versus(self, shape: str, label: str, theirs, ours, tol: float = 1e-9) -> None:
        """``theirs()`` and ``ours()`` checked to ``agree``, then timed: the shape's row."""
        self.agree(shape, theirs(), ours(), tol)
        t = interleaved({"pycocoevalcap": theirs, "rdpp": ours}, self.repeat)
        self.rows[shape] = (label, t["pycocoevalcap"], t["rdpp"])

    def agree(self, shape: str, theirs, ours, tol: float = 1e-9) -> None:
        """Both sides compute the same numbers (checked on an untimed run, before timing)."""
        self.diffs[shape] = float(np.abs(np.asarray(ours) - np.asarray(theirs)).max())
        if not self.diffs[shape] <= tol:
            raise SystemExit(f"shape ({shape}): rdpp and pycocoevalcap differ by {self.diffs[shape]:.2e}; not timed")

    def ratio(self, shape: str) -> float:
        _, ref, ours = self.rows[shape]
        return ref.median / ours.median

    def corpus(self) -> None:
        """(a) corpus mode, strings."""
        x = self.x
        gts, res = {k: x.R[k] for k in range(2000)}, {k: [x.H[k]] for k in range(2000)}
        self.versus("a", "(a) corpus mode, 2,000 x 5 refs, strings", lambda: Cider().compute_score(gts, res)[1],
                    lambda: CiderD().score(x.H, x.R))

    def _flat(self, q, K):
        iu5 = np.triu_indices(self.x.samples.shape[1])
        return np.concatenate([np.concatenate([q[b], K[b][iu5]]) for b in range(len(q))])

    def reward(self) -> float:
        """(b) the training-reward call, in one call and as two; returns two calls' time over one's."""
        s, r, cd, df = self.x.samples, self.x.ref_ids, self.cd, self.x.df
        idx = np.repeat(np.arange(len(s)), s.shape[1])

        def two_calls():
            return cd.score(s.reshape(-1, T), r, idx).reshape(s.shape[:2]), cd.pairwise(s)

        self.theirs = pyco_cider(s, r, self.pdf, df.ref_len)
        self.agree("b", self.theirs, self._flat(*cd.score_and_pairwise(s, r)))  # also builds the df hash table
        self.agree("b two calls", self.theirs, self._flat(*two_calls()))
        t = interleaved({"pycocoevalcap": lambda: pyco_cider(s, r, self.pdf, df.ref_len),
                         "rdpp": lambda: cd.score_and_pairwise(s, r), "rdpp two calls": two_calls}, self.repeat)
        self.rows["b"] = ("(b) reward call: 250 vs 5 refs + 50 5x5, ids (score_and_pairwise)", t["pycocoevalcap"],
                          t["rdpp"])
        self.rows["b two calls"] = ("    same, as score() + pairwise()", t["pycocoevalcap"], t["rdpp two calls"])
        return t["rdpp two calls"].median / t["rdpp"].median

    def self_cider(self, nb: int) -> tuple[float, float]:
        """(c) self-CIDEr: both sides on ``nb`` images, then rdpp alone on 5,000 x 20; returns the
        peak RSS (MB) before and after the big one."""
        x, cd, pdf = self.x, self.cd, self.pdf
        few = x.caps[:nb]
        # tolerance 1e-6: the authors' formula adds the square roots of round-off singular values
        # (~1e-15 -> ~3e-8) that rdpp counts as 0 (docs/metrics.md); kernels agree to ~1e-14
        self.versus("c", f"(c) self-CIDEr {nb:,} x {M_SELF} (kernel + spectrum)", lambda: pyco_self_cider(
            few, pdf, x.df.ref_len), lambda: self_cider_from_kernel(cd.pairwise(few)), tol=1e-6)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        big = interleaved({"rdpp": lambda: self_cider_from_kernel(cd.pairwise(x.caps))}, 3)["rdpp"]
        assert np.isfinite(big.results[-1]).all()
        self.rows["c 5000"] = (f"    self-CIDEr {len(x.caps):,} x {M_SELF}, rdpp only (3 runs)", None, big)
        return rss0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def coco_df(self) -> None:
        """(b') the reward call with a COCO-sized df table, in the same rounds as the small table
        (last, so that the peak RSS of ``self_cider`` is the self-CIDEr step's)."""
        s, r = self.x.samples, self.x.ref_ids
        big = CiderD(coco_sized(self.x.df, len(self.x.vocab)))
        self.agree("b'", self.theirs, self._flat(*big.score_and_pairwise(s, r)))
        tb = interleaved({"small": lambda: self.cd.score_and_pairwise(s, r),
                          "big": lambda: big.score_and_pairwise(s, r)}, self.repeat)
        self.rows["b'"] = (f"    same call, df table of {len(big.df.df) / 1e6:.1f}M n-grams (COCO-sized)", None, tb["big"])


def show(sh: Shapes, out: dict, rss0: float) -> None:
    rows = [[name, ref.ms(), ours.ms(), f"{ref.median / ours.median:,.1f}x", f"{ref.best / ours.best:,.1f}x"] if ref
            else [name, "-", ours.ms(), "-", "-"]
            for name, ref, ours in (sh.rows[k] for k in ("a", "b", "b two calls", "b'", "c", "c 5000"))]
    print_table(f"CIDEr-D: rdpp vs pycocoevalcap, {sh.repeat} interleaved runs each, medians (best beside)",
                ["shape", "pycocoevalcap", "rdpp", "speed-up (medians)", "(bests)"], rows, width=150)
    print(f"score() + pairwise() take {out['two_calls_vs_one']:.2f}x the time of score_and_pairwise() (medians)")
    print(f"max |rdpp - pycocoevalcap| = {out['max_abs_diff']:.2e} "
          f"({', '.join(f'{k}: {v:.1e}' for k, v in sh.diffs.items())}); "
          f"peak RSS {out['peak_rss_mb']:,.0f} MB (before the 5,000-image self-CIDEr {rss0:,.0f} MB)")
    print(f"machine: {out['machine']}")


def main() -> None:
    ap = parser(__doc__)  # --json: only the JSON line
    ap.add_argument("--repeat", type=int, default=7, help="runs of every implementation on every shape")
    ap.add_argument("--self-images", type=int, default=100,
                    help="images of the self-CIDEr shape timed on both sides (pycocoevalcap: ~0.13 s each)")
    args = ap.parse_args()
    sh = Shapes(args.repeat)
    sh.corpus()
    two_calls_vs_one = sh.reward()
    rss0, peak = sh.self_cider(args.self_images)
    sh.coco_df()
    out = {"repeat": args.repeat, "corpus_ratio": round(sh.ratio("a"), 2),
           "reward_call_ms": round(sh.rows["b"][2].median * 1e3, 3), "reward_ratio": round(sh.ratio("b"), 1),
           "two_calls_vs_one": round(two_calls_vs_one, 2),
           "reward_call_ms_coco_sized_df": round(sh.rows["b'"][2].median * 1e3, 3),
           "self_cider_ratio": round(sh.ratio("c"), 1), "self_cider_images": args.self_images,
           "self_cider_5000_s": round(sh.rows["c 5000"][2].median, 3), "max_abs_diff": max(sh.diffs.values()),
           "peak_rss_mb": round(peak, 1), "machine": machine()}
    if not args.json:
        show(sh, out, rss0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
