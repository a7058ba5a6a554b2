"""The compare figure (``rdpp compare --figure ids.txt``): the chosen images in the layout of the
paper's supplement (Figs. S1-S8), one row per image: the photo, then each model's captions (its
set's first ``k``; the caption with the best CIDEr-D in bold). matplotlib, PDF, PNG or SVG. Captions
are drawn as plain text: ``$`` and ``\\`` never start mathtext."""

from __future__ import annotations

import textwrap
from pathlib import Path

from rdpp_cli.artifacts.files import atomic_write_bytes, figure_bytes

WRAP = 44  # characters per line of a caption
FONT = 7.0


def _caption_lines(s, i: int, k: int) -> tuple[list[str], int]:
    """The wrapped lines of model set ``s``'s first ``k`` chosen captions of image ``i``, and the line
    where the best-scored of them starts (-1 when none)."""
    chosen = s.chosen[i][:k]
    best = max(chosen, key=lambda j: s.cider[i][j]) if chosen else -1
    lines, best_line = [], -1
    for n, j in enumerate(chosen, 1):
        if j == best:
            best_line = len(lines)
        wrapped = textwrap.wrap(f"{n}. {s.captions[i][j]}", WRAP, subsequent_indent="   ") or [f"{n}."]
        lines += wrapped
    return lines, best_line


def _photo(ax, path: Path | None, image_id: int, why: str | None = None) -> None:
    from matplotlib.patches import Rectangle

    from rdpp_cli.captioning.contact_sheet import thumbnail

    ax.set_axis_off()
    if path is not None:
        ax.imshow(thumbnail(path, 384))
    else:
        ax.add_patch(Rectangle((0, 0), 1, 1, color="#e4e4e4", transform=ax.transAxes))
        text = "photo does not match\nthe data" if why else "no photo"
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=FONT, transform=ax.transAxes,
                parse_math=False)
    ax.set_title(f"image {image_id}", fontsize=FONT, pad=2)


def _captions(ax, s, i: int, k: int, header: bool) -> None:
    ax.set_axis_off()
    lines, best_line = _caption_lines(s, i, k)
    if header:
        ax.set_title(s.label, fontsize=FONT + 1.5, fontweight="bold", loc="left", pad=6)
    step = 1.0 / max(len(lines) + 1, 9)
    for n, line in enumerate(lines):
        bold = best_line >= 0 and best_line <= n < best_line + _span(lines, best_line)
        ax.text(0.0, 1.0 - (n + 0.5) * step, line, fontsize=FONT, va="center", ha="left", transform=ax.transAxes,
                fontweight="bold" if bold else "normal", parse_math=False)
    ax.text(0.0, 1.0 - (len(lines) + 0.7) * step,
            f"oracle {_num(s.oracle[i])} · self-CIDEr {_num(s.self_cider[i])}", fontsize=FONT - 1, color="#555",
            va="center", transform=ax.transAxes, parse_math=False)


def _span(lines: list[str], start: int) -> int:
    """How many lines the caption starting at ``start`` takes (its wrapped continuation lines)."""
    n = 1
    while start + n < len(lines) and lines[start + n].startswith("   "):
        n += 1
    return n


def draw_figure(cmp, ids: list[int], path: Path, fmt: str, k: int) -> Path:
    """Draw images ``ids`` of the comparison ``cmp`` into ``path`` (format ``fmt``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [cmp.image_ids.index(i) for i in ids]
    tall = max(max(len(_caption_lines(s, i, k)[0]) for s in cmp.sets) for i in rows)
    row_h = max(1.55, 0.13 * (tall + 2))
    M = len(cmp.sets)
    fig = plt.figure(figsize=(1.7 + 2.55 * M, 0.3 + row_h * len(rows)))
    grid = fig.add_gridspec(len(rows), 1 + M, width_ratios=[1.5] + [2.55] * M, wspace=0.08, hspace=0.25,
                            left=0.01, right=0.99, top=1 - 0.3 / (0.3 + row_h * len(rows)), bottom=0.01)
    for r, i in enumerate(rows):
        _photo(fig.add_subplot(grid[r, 0]), cmp.photos[i], cmp.image_ids[i],
               cmp.photo_why[i] if cmp.photo_why else None)
        for m, s in enumerate(cmp.sets):
            _captions(fig.add_subplot(grid[r, 1 + m]), s, i, k, header=r == 0)
    path = Path(path)
    atomic_write_bytes(path, figure_bytes(lambda f: fig.savefig(f, format=fmt, dpi=200 if fmt == "png" else None)))
    plt.close(fig)
    return path


def _num(x: float) -> str:
    """Two decimals, without the "-0.00" of a value a rounding error below zero (identical captions'
    self-CIDEr is 0 up to float rounding); "–" for NaN (a one-caption set has no self-CIDEr)."""
    return "–" if x != x else f"{x:.2f}".replace("-0.00", "0.00")
