"""The compare page: ``index.html`` with the numbers, the Fig. 1 plot and the images, page by page.

The HTML holds the table, the plot and a small index of every image (id, thumbnail, the three
numbers of each model, the words of its captions and references), in the trade-off order; sorting
and filtering run on that index in the browser. The captions and their scores are in
``data/chunk-NNNN.js`` files of ``CHUNK`` images, loaded with a script tag (so the page works from
``file://``) only for the images of the page shown; thumbnails are JPEG files in ``thumbs/``,
loaded lazily. Every text the page shows is set as text (``textContent``), never as HTML, so a
caption holding ``<``, ``&`` or quotes shows as written. The page is written into its claimed
artifact folder; a rerun after an interruption writes ``thumbs/`` and ``data/`` again from scratch.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rdpp_cli.artifacts.files import atomic_write_bytes
from rdpp_cli.console import progress
from rdpp_cli.reporting.report import Table, markdown

CHUNK = 20  # images per data file
THUMB = 192  # pixels on a thumbnail's long side
_WORD = re.compile(r"\w+")
_HERE = Path(__file__).with_name("compare_page.js")


def _json_in_html(obj) -> str:
    """JSON that can sit inside a ``<script>`` element: no ``<``, ``>`` or ``&`` as themselves."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _r(x: float) -> float | None:
    """Three decimals; None (JSON null, shown "–") for NaN: no number, as a one-caption set's self-CIDEr."""
    return None if x != x else round(float(x), 3)


def _words(texts: list[str]) -> str:
    return " ".join(sorted({w for t in texts for w in _WORD.findall(t.lower())}))


def page_index(cmp, order: list[int], thumbs: list[str | None], per_page: int) -> dict:
    """What the page's script sorts and filters: one row per image in the trade-off order."""
    rows = []
    for pos, i in enumerate(order):
        nums = [v for s in cmp.sets for v in (_r(s.mean[i]), _r(s.oracle[i]), _r(s.self_cider[i]))]
        texts = cmp.references[i] + [c for s in cmp.sets for c in s.captions[i]]
        rows.append([cmp.image_ids[i], thumbs[i], pos // CHUNK, pos % CHUNK, _r(cmp.tradeoff[i]),
                     int(cmp.pair[i][0]), int(cmp.pair[i][1]), nums, _words(texts)])
    return {"models": [s.label for s in cmp.sets], "selection": [s.selection for s in cmp.sets],
            "per_page": per_page, "photo_note": cmp.photo_note, "images": rows}


def _chunk_record(cmp, i: int) -> dict:
    photo = cmp.photos[i]
    why = cmp.photo_why[i] if cmp.photo_why else None
    return {"r": cmp.references[i], "f": photo.name if photo is not None else None,
            **({"w": why} if photo is None and why else {}),
            "s": [[s.captions[i], [_r(x) for x in s.cider[i]], s.chosen[i]] for s in cmp.sets]}


def _fresh(folder: Path) -> None:
    """``folder``, empty: what an interrupted run left there (the same page's files, half written)
    is redone, not trusted."""
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir()


def write_chunks(cmp, order: list[int], folder: Path) -> int:
    """The data files; returns how many."""
    _fresh(folder)
    n = 0
    for k in range(0, len(order), CHUNK):
        recs = [_chunk_record(cmp, i) for i in order[k:k + CHUNK]]
        text = f"rdppChunk({k // CHUNK},{json.dumps(recs, ensure_ascii=True, separators=(',', ':'))});\n"
        atomic_write_bytes(folder / f"chunk-{k // CHUNK:04d}.js", text.encode("ascii"))
        n += 1
    return n


def _thumb(src: Path, dest: Path) -> bool:
    from rdpp_cli.captioning.contact_sheet import thumbnail

    try:
        thumb = thumbnail(src, THUMB)
    except OSError:  # unreadable photo: a placeholder stands in
        return False
    buf = io.BytesIO()
    thumb.save(buf, format="JPEG", quality=80)
    atomic_write_bytes(dest, buf.getvalue())  # a failed write (a full disk) stops the page: never a silent placeholder
    return True


def write_thumbs(cmp, folder: Path) -> list[str | None]:
    """``thumbs/<id>.jpg`` of every photo found (threads: decoding releases the GIL); the relative
    path of each image's thumbnail, None where there is no photo."""
    _fresh(folder)
    jobs = [(i, p, folder / f"{cmp.image_ids[i]}.jpg") for i, p in enumerate(cmp.photos) if p is not None]
    out: list[str | None] = [None] * len(cmp.photos)
    with progress("photos") as bar, ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        task = bar.add_task("thumbnails", total=len(jobs), info="")
        for (i, _, dest), ok in zip(jobs, pool.map(lambda j: _thumb(j[1], j[2]), jobs)):
            out[i] = f"thumbs/{dest.name}" if ok else None
            bar.advance(task)
    return out


def table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f'<td class="{"num" if a == "r" else ""}">{html.escape(str(c))}</td>'
                                   for c, a in zip(r, t.align)) + "</tr>" for r in t.rows)
    return f'<table class="numbers"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:20px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}p.sub{color:#555;margin:0 0 14px;font-size:13px}
.top{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}.top img{width:420px;border:1px solid #ddd}
table.numbers{border-collapse:collapse;font-size:13px}table.numbers td,table.numbers th{border-bottom:1px solid #ddd;
padding:3px 8px}td.num{text-align:right;font-variant-numeric:tabular-nums}
#controls{position:sticky;top:0;background:#fafafa;padding:8px 0;border-bottom:1px solid #ddd;margin:14px 0;z-index:2;
font-size:13px;display:flex;flex-wrap:wrap;gap:10px;align-items:center}
.card{display:flex;gap:12px;background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px;margin:0 0 12px}
.photo{flex:none;width:192px}.photo img{width:192px;height:192px;object-fit:contain;background:#eee}
.placeholder{width:192px;height:192px;background:#e4e4e4;color:#555;font-size:12px;display:flex;align-items:center;
justify-content:center;text-align:center;padding:8px;box-sizing:border-box}
.meta{font-size:12px;color:#555;margin-top:4px;word-break:break-all}.why{font-size:12px;color:#375;margin-top:4px}
.sets{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:10px;flex:1}
.set h3,.refs h3{font-size:13px;margin:0 0 2px;color:#234b9b}.stats{font-size:12px;color:#555;margin-bottom:3px}
ol{margin:0;padding-left:20px;font-size:13px;line-height:1.4}li .s{color:#888;font-size:11px;margin-left:4px}
li.best{font-weight:600}li.out{color:#999}li .ok{color:#1a7f37}mark{background:#ffe58a}.refs ol{color:#444}
"""


def render_html(title: str, subtitle: str, table: Table, index: dict) -> str:
    script = _HERE.read_text(encoding="utf-8")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style><script>{_ERRORS}</script></head><body>"
            f"<h1>{html.escape(title)}</h1><p class=\"sub\">{html.escape(subtitle)}</p>"
            f'<div class="top">{table_html(table)}<img src="plot.png" alt="diversity against accuracy"></div>'
            f"{_CONTROLS}<div id=\"cards\"></div><div id=\"pager2\"></div>"
            f'<script id="rdpp-index" type="application/json">{_json_in_html(index)}</script>'
            f"<script>{script}</script></body></html>\n")


# every error (a script's, a file not found) is counted on <html data-errors>: the browser test reads it
_ERRORS = ("window.RDPP_ERRORS=[];addEventListener('error',function(e){RDPP_ERRORS.push(String(e.message||"
           "(e.target&&(e.target.src||e.target.href))||'error'));document.documentElement.dataset.errors="
           "RDPP_ERRORS.length},true);")

_CONTROLS = """<div id="controls">
<label>sort <select id="sort"><option value="tradeoff">trade-off (one model ahead on both axes)</option>
<option value="diff">where model A leads model B most</option><option value="id">image id</option></select></label>
<label>by <select id="metric"><option value="1">oracle CIDEr-D</option><option value="2">self-CIDEr</option>
<option value="0">mean CIDEr-D</option></select></label>
<label>A <select id="a"></select></label><label>B <select id="b"></select></label>
<label>image id <input id="id" size="10" placeholder="e.g. 42,57"></label>
<label>word <input id="word" size="12" placeholder="e.g. dog"></label>
<button id="prev">‹ prev</button><span id="pageinfo"></span><button id="next">next ›</button>
<span id="count"></span></div>"""


def write_page(cmp, out: Path, table: Table, record: dict, per_page: int,
               figure: Callable[[Path], object] | None = None) -> None:
    """Write the page's files into the claimed artifact folder ``out`` (index.html, plot.png, table.md,
    compare.json, thumbs/, data/, and the figure); the manifest, written after them, completes it."""
    from rdpp_cli.scoring.plot import ONE_CAPTION, plot_points

    order = [int(i) for i in sorted(range(len(cmp.image_ids)), key=lambda i: -cmp.tradeoff[i])]
    thumbs = write_thumbs(cmp, out / "thumbs")
    write_chunks(cmp, order, out / "data")
    points = [(s.label, s.summary["self_cider"], s.summary["CIDEr"]) for s in cmp.sets]
    plot_points(points, cmp.human, out / "plot.png", title=f"{cmp.data.name}, {cmp.split} split",
                why={s.label: ONE_CAPTION for s in cmp.sets if s.summary["self_cider"] is None})
    atomic_write_bytes(out / "table.md", markdown([table]).encode("utf-8"))
    title = "rdpp compare: " + " · ".join(s.label for s in cmp.sets)
    subtitle = (f"{len(cmp.image_ids):,} images of {cmp.data.name} ({cmp.split} split); CIDEr-D of every caption "
                f"against the image's references, oracle = the set's best, self-CIDEr = the set's diversity. "
                + (cmp.photo_note + "." if cmp.photo_note else ""))
    page = render_html(title, subtitle, table, page_index(cmp, order, thumbs, per_page))
    atomic_write_bytes(out / "index.html", page.encode("utf-8"))
    if figure is not None:
        figure(out)
    atomic_write_bytes(out / "compare.json", json.dumps(record, indent=1, default=str).encode("utf-8"))
