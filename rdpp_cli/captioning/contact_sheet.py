"""A self-contained HTML contact sheet: every photo as a thumbnail beside its caption set.

Thumbnails are embedded as ``data:`` JPEG URIs and the style is inline, so the one file opens in
any browser with no network and no other files. Photos are shown upright (EXIF orientation) with
their aspect ratio, at most ``THUMB`` pixels on their long side.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

THUMB = 256


@dataclass
class SheetEntry:
    """One photo of the sheet and its captions (best first)."""

    path: Path
    image_id: int
    captions: list[str]
    logprobs: list[float] = field(default_factory=list)


def thumbnail(path: Path, size: int = THUMB):
    """The photo upright, in RGB, fitted into size×size (aspect kept): a PIL image."""
    from PIL import Image, ImageOps

    from rdpp_cli.data.features import to_rgb

    with Image.open(path) as im:
        im = to_rgb(ImageOps.exif_transpose(im) if im.getexif().get(0x0112, 1) != 1 else im)
        im.thumbnail((size, size), Image.BILINEAR)  # a large JPEG is decoded at a reduced scale (draft)
        im.load()  # a photo already within size×size was not resized: read it before the file closes
        return im


def _data_uri(path: Path) -> str:
    buf = io.BytesIO()
    thumbnail(path).save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}p.sub{color:#666;margin:0 0 20px;font-size:13px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
.card{display:flex;gap:14px;background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px}
.card img{width:256px;height:256px;object-fit:contain;background:#eee;flex:none}
.name{font-size:12px;color:#666;margin-bottom:6px;word-break:break-all}
ol{margin:0;padding-left:20px;font-size:14px;line-height:1.45}li span{color:#999;font-size:11px}
"""


def render_html(entries: list[SheetEntry], *, title: str, subtitle: str = "") -> str:
    """The contact sheet as one HTML document."""
    cards = []
    for e in entries:
        items = "".join(
            f"<li>{html.escape(c)}" + (f" <span>({e.logprobs[k]:.2f})</span>" if k < len(e.logprobs) else "") + "</li>"
            for k, c in enumerate(e.captions))
        cards.append(
            f'<div class="card"><img src="{_data_uri(e.path)}" alt="{html.escape(e.path.name)}">'
            f'<div><div class="name">{html.escape(e.path.name)} · id {e.image_id}</div><ol>{items}</ol></div></div>')
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class=\"sub\">{html.escape(subtitle)}</p><div class=\"grid\">\n" + "\n".join(cards)
            + "\n</div></body></html>\n")
