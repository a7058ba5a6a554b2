"""The diversity-accuracy plane of the paper's Fig. 1: x = self-CIDEr diversity of each image's
captions, y = mean CIDEr of the captions; one point per scores artifact, plus the human references
(leave-one-out CIDEr against their own self-CIDEr)."""

from __future__ import annotations

import json
from pathlib import Path

from rdpp_cli.artifacts import read_artifact, resolve_input
from rdpp_cli.artifacts.files import atomic_write_bytes, figure_bytes
from rdpp_cli.artifacts.workspace import list_artifacts
from rdpp_cli.console import console, note, summary_table
from rdpp_cli.errors import RdppError
from rdpp_cli.options import takes
from rdpp_cli.scoring.options import PlotOptions

Point = tuple[str, float | None, float | None]


Curve = tuple  # (label, [(self_cider, cider, point label), ...]) or (label, points, line kwargs)


NO_NUMBERS = "no self-CIDEr or CIDEr in its scores (score it with --self-cider)"
ONE_CAPTION = "one caption per image: self-CIDEr needs at least 2"


def plot_points(points: list[Point], human: dict | None, out_png: Path, title: str | None = None,
                curves: list[Curve] | None = None, styles: list[dict] | None = None,
                why: dict[str, str] | None = None) -> Path:
    """Draw ``(label, self_cider, cider)`` points (and the human point) into ``out_png``; each of
    ``curves`` (``(label, [(self_cider, cider, point label), ...][, matplotlib line kwargs])``, e.g.
    one model sampled at several temperatures) is a line through its points in the given order;
    ``styles[i]``: matplotlib scatter kwargs of point i (``label`` puts it in the legend). A point
    without both numbers is left out, with a note in the terminal and under the plot saying why
    (``why[label]``, else ``NO_NUMBERS``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_png = Path(out_png)
    fig, ax = plt.subplots(figsize=(8, 6) if curves else (6, 4.5), dpi=120)
    for label, pts, *kw in curves or []:
        xs, ys, names = zip(*pts) if pts else ((), (), ())
        ax.plot(xs, ys, **{"marker": ".", "linewidth": 1, "alpha": 0.7, "zorder": 2, **(kw[0] if kw else {})},
                label=label)
        for x, y, name in pts:
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(3, -9), fontsize=6, alpha=0.8)
    left_out = []
    for k, (label, x, y) in enumerate(points):
        if x is None or y is None:
            left_out.append(f"{label} ({(why or {}).get(label, NO_NUMBERS)})")
            note(f"{left_out[-1]}; not plotted")
            continue
        ax.scatter([x], [y], **{"s": 40, "zorder": 3, **(styles[k] if styles else {})})
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8 if not curves else 6)
    if human:
        ax.scatter([human["self_cider"]], [human["cider_leave_one_out"]], marker="*", s=160, color="black", zorder=4)
        ax.annotate("human references", (human["self_cider"], human["cider_leave_one_out"]),
                    textcoords="offset points", xytext=(6, -10), fontsize=8)
    ax.set_xlabel("diversity (self-CIDEr)")
    ax.set_ylabel("accuracy (mean CIDEr)")
    ax.set_title(title or "diversity vs accuracy")
    ax.grid(alpha=0.3)
    if curves or any("label" in st for st in styles or []):
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    if left_out:
        fig.subplots_adjust(bottom=fig.subplotpars.bottom + 0.05 * len(left_out))
        fig.text(0.01, 0.01, "\n".join(f"not plotted: {t}" for t in left_out), fontsize=7, color="#a33",
                 va="bottom", parse_math=False)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_png, figure_bytes(lambda f: fig.savefig(f, format="png")))
    plt.close(fig)
    return out_png


def plot_scores(scores_dirs: list[Path], out_png: Path, labels: list[str] | None = None) -> Path:
    """One point per scores artifact (``scores.json``: diversity.self_cider, accuracy.CIDEr) and the
    human references' point of the first artifact that has one; writes ``out_png``."""
    if not scores_dirs:
        raise RdppError("no scores artifacts to plot; make one with `rdpp score --self-cider`")
    if labels is not None and len(labels) != len(scores_dirs):
        raise RdppError(f"{len(labels)} labels for {len(scores_dirs)} scores artifacts; give one label each")
    points: list[Point] = []
    why: dict[str, str] = {}
    human = None
    for k, d in enumerate(scores_dirs):
        art = read_artifact(d, "rdpp.scores")
        s = json.loads(art.file("scores.json").read_text())
        label = labels[k] if labels else art.name
        points.append((label, (s.get("diversity") or {}).get("self_cider"), (s.get("accuracy") or {}).get("CIDEr")))
        if points[-1][1] is None and (s.get("settings") or {}).get("self_cider_variant"):
            why[label] = ONE_CAPTION  # self-CIDEr was asked for: the samples had one caption per image
        human = human or s.get("human")
    return plot_points(points, human, out_png, why=why)


@takes(PlotOptions)
def plot(opts: PlotOptions) -> Path:
    """`rdpp plot`: the given scores artifacts (paths or workspace names; default: all of them)."""
    from rdpp_cli.artifacts import workspace_dir

    if opts.scores:
        dirs = [resolve_input(s, workspace=opts.workspace, groups=("scores",), kind="rdpp.scores",
                              what="scores artifact", make_with="rdpp score --self-cider").path for s in opts.scores]
    else:
        dirs = [a.path for a in list_artifacts(opts.workspace, ("scores",))]
        if not dirs:
            raise RdppError(f"no scores artifacts in {workspace_dir(opts.workspace)}; make one with "
                            "`rdpp score --self-cider`")
    out = Path(opts.out) if opts.out is not None else workspace_dir(opts.workspace) / "plots" / "diversity-accuracy.png"
    path = plot_scores(dirs, out, opts.label_list())
    console.print(summary_table("rdpp plot", [("plot", path), ("points", len(dirs))]))
    return path
