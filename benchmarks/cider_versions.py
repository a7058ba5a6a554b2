"""The CIDEr-D package against an earlier version of itself: did a change cost speed?

Loads ``rdpp_cli/metrics/cider.py`` as it was at a git revision (default 787cd4c, rdpp 0.1.0: the
last revision where CIDEr-D was one module, not the package ``rdpp_cli/metrics/cider/``) next to the
package, checks that both give the same numbers on every shape, then times them interleaved, the
same number of runs each, on the inputs of benchmarks/metrics.py, and prints medians (best beside).

    python benchmarks/cider_versions.py [--rev 787cd4c] [--repeat 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from metrics import T, make_inputs  # noqa: E402
from timing import interleaved, machine  # noqa: E402

import rdpp_cli.metrics.cider as new  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def load_old(rev: str):
    """``rdpp_cli/metrics/cider.py`` at ``rev``, imported as a module of its own."""
    src = subprocess.run(["git", "show", f"{rev}:rdpp_cli/metrics/cider.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "cider_old.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("cider_old", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cider_old"] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def shapes(mod, x, df):
    """name -> a call of ``mod`` on the inputs (``df``: a DocFreq of ``mod`` built from the same data)."""
    cd = mod.CiderD(df)
    s, r = x.samples, x.ref_ids
    idx = np.repeat(np.arange(len(s)), s.shape[1])
    caps = x.caps[:1000]
    cd.score_and_pairwise(s, r)  # the df hash table, built once as in training
    return {
        "(a) corpus mode, 2,000 x 5 refs, strings": lambda: mod.CiderD().score(x.H, x.R),
        "(b) reward call, score_and_pairwise, 50 x 5": lambda: cd.score_and_pairwise(s, r),
        "(b) as score() + pairwise()": lambda: (cd.score(s.reshape(-1, T), r, idx), cd.pairwise(s)),
        "(c) pairwise kernels, 1,000 x 20, fixed df": lambda: cd.pairwise(caps),
        "    plain-CIDEr kernels, 1,000 x 20": lambda: cd.pairwise(caps, kind="cider"),
        "(d) DocFreq.from_references, 800 images + hash build": lambda: _df_and_table(mod, x.train_ids),
        "(e) ngram_postings (Div-n, mBLEU), 1,000 x 20": lambda: _postings(mod.ngram_postings(caps)[0]),
    }


def _df_and_table(mod, train):
    df = mod.DocFreq.from_references(train)
    return df.lookup(df.ngrams)


def _postings(p):
    return np.concatenate([p.row, p.slot, p.count, p.gram_key])


def _flat(out) -> np.ndarray:
    if isinstance(out, tuple):
        return np.concatenate([np.asarray(o, np.float64).ravel() for o in out])
    return np.asarray(out, np.float64).ravel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="787cd4c", help="git revision holding the single-module cider.py")
    ap.add_argument("--repeat", type=int, default=9, help="runs of each version on each shape")
    args = ap.parse_args()
    old = load_old(args.rev)
    x = make_inputs(self_images=1000)
    calls_old = shapes(old, x, old.DocFreq(x.df.ngrams, x.df.df, x.df.num_docs))
    calls_new = shapes(new, x, new.DocFreq(x.df.ngrams, x.df.df, x.df.num_docs))
    rows = []
    for name in calls_new:
        a, b = _flat(calls_old[name]()), _flat(calls_new[name]())
        if a.shape != b.shape or not np.array_equal(a, b):
            raise SystemExit(f"{name}: the two versions give different results; not timed")
        t = interleaved({"old": calls_old[name], "new": calls_new[name]}, args.repeat)
        rows.append((name, t["old"], t["new"]))

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CIDEr-D at {args.rev} (one module) vs the package: {args.repeat} interleaved runs "
                  "each, medians (best in brackets); results identical", title_justify="left")
    for col in ("shape", f"{args.rev} ms", "package ms", f"package / {args.rev} (medians)"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for name, o, n in rows:
        table.add_row(name, f"{o.median * 1e3:,.2f} ({o.best * 1e3:,.2f})", f"{n.median * 1e3:,.2f} ({n.best * 1e3:,.2f})",
                      f"{n.median / o.median:.2f}")
    Console(width=150).print(table)
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
