"""The "Real photos" numbers of docs/reproduction.md, from a workspace made by examples/real_photos.sh.

    python examples/real_photos_report.py runs-real [--licenses LICENSES.tsv] [--sheet contact-sheet.png]

Prints (Markdown): the time of every stage (``<ws>/times.tsv``), the data artifact's summary, the
XE model's validation CIDEr-D against the trivial baseline, the table XE / SCST / R-DPP m=5
(greedy CIDEr; mean, oracle (best of 10), self-CIDEr and Div-2 of 10 random captions per test
photo) and the caption sets of three test photos. The three photos are not picked by their
captions: they are the first test photos (in the data's order) whose licence lets the project
show them (CC BY / CC BY-SA).

``--sheet`` renders the contact sheet of the 39 test photos as a PNG: each photo beside the XE and
the R-DPP model's 5 random captions (the `rdpp caption` artifacts). Photos under other licences
(non-commercial, no-derivatives) are not reproduced: a grey box with their id and licence stands in.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
SHOWABLE = ("Attribution License", "Attribution-ShareAlike License")
SHORT = {"Attribution License": "CC BY 2.0", "Attribution-ShareAlike License": "CC BY-SA 2.0",
         "Attribution-NoDerivs License": "CC BY-ND 2.0", "Attribution-NonCommercial License": "CC BY-NC 2.0",
         "Attribution-NonCommercial-ShareAlike License": "CC BY-NC-SA 2.0",
         "Attribution-NonCommercial-NoDerivs License": "CC BY-NC-ND 2.0"}


def short(licence: str) -> str:
    return SHORT.get(licence, licence)


def _json(p: Path) -> dict | list:
    return json.loads(p.read_text())


def _f(x, nd=3) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def licences(path: Path | None) -> dict[int, tuple[str, str]]:
    """COCO id -> (licence name, Flickr url), from the set's LICENSES.tsv."""
    if path is None or not path.is_file():
        return {}
    with open(path) as f:
        return {int(Path(r["image"]).stem): (r["license"], r["flickr_url"]) for r in csv.DictReader(f, delimiter="\t")}


def report(ws: Path, lic: dict[int, tuple[str, str]]) -> list[int]:
    """Print the Markdown; returns the ids of the three example photos."""
    times = ws / "times.tsv"
    if times.is_file():
        print("Times per stage (wall clock; load average at the end of the stage):\n")
        print("| stage | seconds | load |\n|---|---:|---:|")
        for line in times.read_text().splitlines():
            name, secs, load = (line.split("\t") + ["", ""])[:3]
            print(f"| {name} | {float(secs):,.0f} | {load} |")
    data = _json(ws / "data" / "real" / "manifest.json")
    s = data["summary"]
    print(f"\nData artifact: {s['images']} photos (train {s['train']} / val {s['val']} / test {s['test']}), "
          f"{s['captions']:,} captions; vocabulary {s['vocab']:,} words (count > {s['word_count_threshold']}, "
          f"the `auto` threshold); UNK {s['unk_rate_train']:.1%} of the training tokens, {s['unk_rate']:.1%} of all; "
          f"{s['clipped']:.1%} of the captions clipped at {data['config']['max_length']} tokens.")
    xe = _json(ws / "xe" / "xe" / "manifest.json")["summary"]
    print(f"\nXE: best val CIDEr-D {xe['val_cider']:.3f} (greedy, UNK suppressed, training df) against "
          f"{xe['baseline_cider']:.3f} for the trivial captioner (the most frequent training caption for every photo).")
    print("\n| model | greedy CIDEr | mean sample CIDEr | oracle CIDEr (best of 10) | self-CIDEr | Div-2 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, label in MODELS:
        g = _json(ws / "scores" / f"{name}-greedy" / "scores.json")
        r = _json(ws / "scores" / f"{name}-random10" / "scores.json")
        print(f"| {label} | {_f(g['accuracy']['CIDEr'])} | {_f(r['average']['CIDEr'])} | {_f(r['oracle']['CIDEr'])} "
              f"| {_f(r['diversity']['self_cider'])} | {_f(r['diversity']['div2'])} |")
    samples = {name: {e["image_id"]: e["captions"] for e in _json(ws / "samples" / f"{name}-random10" / "samples.json")}
               for name, _ in MODELS}
    greedy = {name: {e["image_id"]: e["captions"][0] for e in _json(ws / "samples" / f"{name}-greedy" / "samples.json")}
              for name, _ in MODELS}
    test_ids = list(samples["xe"])
    shown = [i for i in test_ids if lic.get(i, ("",))[0] in SHOWABLE][:3] or test_ids[:3]
    print("\nThree test photos: each model's greedy caption, then its caption set (the first 5 of the 10 random "
          "captions, distinct ones):\n")
    for i in shown:
        where = f" ({short(lic[i][0])}, {lic[i][1]})" if i in lic else ""
        print(f"- COCO {i}{where}")
        for name, label in MODELS:
            caps = list(dict.fromkeys(samples[name][i][:5]))
            print(f"  - {label}: greedy “{greedy[name][i]}”; random " + " · ".join(f"“{c}”" for c in caps))
    return shown


def render_sheet(ws: Path, lic: dict[int, tuple[str, str]], out: Path) -> None:
    """The 39 test photos with the XE and R-DPP models' `rdpp caption` results, as one PNG."""
    from PIL import Image, ImageDraw, ImageFont

    from rdpp_cli.captioning.contact_sheet import thumbnail

    runs = [(label, {e["image_id"]: e for e in _json(ws / "captions" / f"{name}-random5" / "results.json")})
            for name, label in (("xe", "XE"), ("dpp-m5", "R-DPP m=5"))]
    ids = list(runs[0][1])
    thumb, pad, line = 150, 10, 17
    font, bold = ImageFont.load_default(size=13), ImageFont.load_default(size=14)
    col = 430
    row_h = max(thumb + line + 4, 22 + line * 5) + pad
    W = pad + thumb + pad + col * len(runs) + pad
    H = 40 + row_h * len(ids) + 40
    sheet = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(sheet)
    d.text((pad, 12), f"{len(ids)} COCO test photos, 5 random captions each by `rdpp caption` "
                      "(XE | R-DPP m=5); examples/real_photos.sh", fill="black", font=bold)
    for k, i in enumerate(ids):
        y = 40 + k * row_h
        name, url = lic.get(i, ("unknown licence", ""))
        if name in SHOWABLE:
            im = thumbnail(Path(runs[0][1][i]["file"]), thumb)
            sheet.paste(im, (pad + (thumb - im.width) // 2, y + (thumb - im.height) // 2))
        else:
            d.rectangle([pad, y, pad + thumb, y + thumb], fill=(225, 225, 225))
            for j, text in enumerate(("photo not shown;", "licence", short(name))):
                d.text((pad + 8, y + 50 + j * line), text, fill=(90, 90, 90), font=font)
        d.text((pad, y + thumb + 2), f"COCO {i}", fill=(90, 90, 90), font=font)
        for c, (label, res) in enumerate(runs):
            x = pad + thumb + pad + c * col
            d.text((x, y), label, fill=(30, 60, 150), font=bold)
            for j, cap in enumerate(res[i]["captions"][:5]):
                text = cap if d.textlength(cap, font=font) < col - 20 else cap[:60] + "…"
                d.text((x, y + 20 + j * line), f"{j + 1}. {text}", fill="black", font=font)
        d.line([pad, y + row_h - pad // 2, W - pad, y + row_h - pad // 2], fill=(230, 230, 230))
    shown = [f"{i} ({lic[i][1]}, {short(lic[i][0])})" for i in ids if lic.get(i, ("",))[0] in SHOWABLE]
    y = 40 + row_h * len(ids) + 8
    d.text((pad, y), "Photos shown: Flickr via COCO (cocodataset.org), unchanged but scaled; see the attribution list "
                     "in docs/reproduction.md. Captions of the others only.", fill=(90, 90, 90), font=font)
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.quantize(256, dither=Image.Dither.NONE).save(out, optimize=True)  # a quarter of the bytes
    print(f"\nContact sheet: {out} ({len(ids)} photos, {len(shown)} shown). Photos shown (COCO id, original, licence):\n")
    for s_ in shown:
        print(f"- {s_}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workspace", type=Path)
    ap.add_argument("--licenses", type=Path, default=None, help="the set's LICENSES.tsv")
    ap.add_argument("--sheet", type=Path, default=None, help="write the contact sheet PNG here")
    args = ap.parse_args()
    lic = licences(args.licenses)
    report(args.workspace, lic)
    if args.sheet:
        render_sheet(args.workspace, lic, args.sheet)


if __name__ == "__main__":
    sys.exit(main())
