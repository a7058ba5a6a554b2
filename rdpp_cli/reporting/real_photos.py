"""The report of the real-photo run (docs/reproduction.md#real-photos-cpu-about-15-hours), from its
workspace: the time of every stage (``times.tsv``), the data artifact's summary (``data/real``), the
XE model's validation CIDEr-D against the trivial captioner (``xe/xe``), the table XE / SCST / R-DPP m=5
(greedy CIDEr of ``scores/<model>-greedy``; mean, oracle (best of 10), self-CIDEr and Div-2 of
``scores/<model>-random10``) and the caption sets of three test photos. The three are not picked
by their captions: they are the first test photos (in the data's order) whose licence lets the
project show them (CC BY / CC BY-SA; from the set's LICENSES.tsv).

``contact_sheet`` renders the test photos beside the XE and the R-DPP model's captions (the
``captions/<model>-random5`` artifacts of `rdpp caption`) as one PNG; photos under other licences
are not reproduced: a grey box with their id and licence stands in.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rdpp_cli.artifacts.files import atomic_write_bytes, figure_bytes
from rdpp_cli.errors import RdppError
from rdpp_cli.reporting.report import Block, Num, Table, Text, get, read_json, samples, scores

MODELS = [("xe", "XE"), ("scst", "SCST"), ("dpp-m5", "R-DPP m=5")]
SHOWABLE = ("Attribution License", "Attribution-ShareAlike License")
SHORT = {"Attribution License": "CC BY 2.0", "Attribution-ShareAlike License": "CC BY-SA 2.0",
         "Attribution-NoDerivs License": "CC BY-ND 2.0", "Attribution-NonCommercial License": "CC BY-NC 2.0",
         "Attribution-NonCommercial-ShareAlike License": "CC BY-NC-SA 2.0",
         "Attribution-NonCommercial-NoDerivs License": "CC BY-NC-ND 2.0"}

Licences = dict[int, tuple[str, str]]


def short(licence: str) -> str:
    return SHORT.get(licence, licence)


def licences(path: Path | None) -> Licences:
    """COCO id -> (licence name, Flickr url), from the set's LICENSES.tsv (empty without one)."""
    if path is None or not Path(path).is_file():
        return {}
    with open(path, newline="") as f:
        return {int(Path(r["image"]).stem): (r["license"], r["flickr_url"]) for r in csv.DictReader(f, delimiter="\t")}


def times(ws: Path) -> list[Block]:
    path = ws / "times.tsv"
    if not path.is_file():
        return []
    t = Table(["stage", "seconds", "load"], title="Times per stage (wall clock; load average at the end of the stage):",
              align="lrr")
    for line in path.read_text().splitlines():
        name, secs, load = (line.split("\t") + ["", ""])[:3]
        t.rows.append([name, Num(float(secs), ",.0f"), load])
    return [t]


def data_and_xe(ws: Path) -> list[Block]:
    """A sentence on the data artifact, and one on the XE model's validation CIDEr-D."""
    blocks: list[Block] = []
    data = read_json(ws / "data" / "real" / "manifest.json")
    if data is not None:
        s = data["summary"]
        blocks.append(Text([
            f"Data artifact: {s['images']} photos (train {s['train']} / val {s['val']} / test {s['test']}), "
            f"{s['captions']:,} captions; vocabulary {s['vocab']:,} words (count > {s['word_count_threshold']}, "
            f"the `auto` threshold); UNK {s['unk_rate_train']:.1%} of the training tokens, {s['unk_rate']:.1%} of all; "
            f"{s['clipped']:.1%} of the captions clipped at {data['config']['max_length']} tokens."]))
    xe = get(read_json(ws / "xe" / "xe" / "manifest.json"), "summary")
    if xe is not None:
        blocks.append(Text([
            f"XE: best val CIDEr-D {xe['val_cider']:.3f} (greedy, UNK suppressed, training df) against "
            f"{xe['baseline_cider']:.3f} for the trivial captioner (the most frequent training caption for every "
            "photo)."]))
    return blocks


def models_table(ws: Path) -> Table:
    t = Table(["model", "greedy CIDEr", "mean sample CIDEr", "oracle CIDEr (best of 10)", "self-CIDEr", "Div-2"],
              align="lrrrrr")
    for name, label in MODELS:
        g, r = scores(ws, f"{name}-greedy"), scores(ws, f"{name}-random10")
        if g is None and r is None:
            continue
        t.rows.append([label, *(Num(get(s, *k)) for s, k in (
            (g, ("accuracy", "CIDEr")), (r, ("average", "CIDEr")), (r, ("oracle", "CIDEr")),
            (r, ("diversity", "self_cider")), (r, ("diversity", "div2"))))])
    return t


def examples(ws: Path, lic: Licences) -> list[Block]:
    """Each model's greedy caption and its first 5 random captions (distinct ones) of three test photos."""
    sets = {name: samples(ws, f"{name}-random10") for name, _ in MODELS}
    greedy = {name: samples(ws, f"{name}-greedy") for name, _ in MODELS}
    if any(v is None for v in (*sets.values(), *greedy.values())):
        return []
    sets = {name: {e["image_id"]: e["captions"] for e in v} for name, v in sets.items()}
    greedy = {name: {e["image_id"]: e["captions"][0] for e in v} for name, v in greedy.items()}
    test_ids = list(sets["xe"])
    shown = [i for i in test_ids if lic.get(i, ("",))[0] in SHOWABLE][:3] or test_ids[:3]
    lines = ["Three test photos: each model's greedy caption, then its caption set (the first 5 of the 10 random "
             "captions, distinct ones):", ""]
    for i in shown:
        where = f" ({short(lic[i][0])}, {lic[i][1]})" if i in lic else ""
        lines.append(f"- COCO {i}{where}")
        for name, label in MODELS:
            caps = list(dict.fromkeys(sets[name][i][:5]))
            random = " · ".join(f"“{c}”" for c in caps)
            lines.append(f"  - {label}: greedy “{greedy[name][i]}”; random {random}")
    return [Text(lines)]


def real_photos(ws: Path, licenses: Path | None = None, sheet: Path | None = None) -> list[Block]:
    """The whole report; with ``sheet``, also the contact sheet PNG and the list of photos shown."""
    lic = licences(licenses)
    blocks = [*times(ws), *data_and_xe(ws), models_table(ws), *examples(ws, lic)]
    if sheet is not None:
        shown = contact_sheet(ws, lic, sheet)
        blocks.append(Text([f"Contact sheet: {sheet} ({shown[0]} photos, {len(shown[1])} shown). Photos shown "
                            "(COCO id, original, licence):", "", *(f"- {s}" for s in shown[1])]))
    return blocks


SHEET_RUNS = (("xe", "XE"), ("dpp-m5", "R-DPP m=5"))
THUMB, PAD, LINE, COL = 150, 10, 17, 430


def contact_sheet(ws: Path, lic: Licences, out: Path) -> tuple[int, list[str]]:
    """The test photos with the XE and R-DPP models' `rdpp caption` results, as one PNG; returns the
    number of photos and "id (url, licence)" of each photo shown."""
    from PIL import Image, ImageDraw, ImageFont

    runs = []
    for name, label in SHEET_RUNS:
        res = read_json(ws / "captions" / f"{name}-random5" / "results.json")
        if res is None:
            raise RdppError(f"no captions/{name}-random5 in {ws} for the contact sheet; caption the test photos "
                            "with `rdpp caption --out` there first, or leave out --sheet")
        runs.append((label, {e["image_id"]: e for e in res}))
    ids = list(runs[0][1])
    fonts = ImageFont.load_default(size=13), ImageFont.load_default(size=14)
    row_h = max(THUMB + LINE + 4, 22 + LINE * 5) + PAD
    width = PAD + THUMB + PAD + COL * len(runs) + PAD
    img = Image.new("RGB", (width, 40 + row_h * len(ids) + 40), "white")
    d = ImageDraw.Draw(img)
    d.text((PAD, 12), f"{len(ids)} COCO test photos, 5 random captions each by `rdpp caption` "
                      "(XE | R-DPP m=5); examples/real_photos.sh", fill="black", font=fonts[1])
    for k, i in enumerate(ids):
        _sheet_row(img, d, fonts, 40 + k * row_h, i, runs, lic.get(i, ("unknown licence", "")))
        y = 40 + k * row_h + row_h - PAD // 2
        d.line([PAD, y, width - PAD, y], fill=(230, 230, 230))
    shown = [f"{i} ({lic[i][1]}, {short(lic[i][0])})" for i in ids if lic.get(i, ("",))[0] in SHOWABLE]
    d.text((PAD, 40 + row_h * len(ids) + 8), "Photos shown: Flickr via COCO (cocodataset.org), unchanged but scaled; "
           "see the attribution list in docs/reproduction.md. Captions of the others only.", fill=(90, 90, 90),
           font=fonts[0])
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    small = img.quantize(256, dither=Image.Dither.NONE)  # a quarter of the bytes
    atomic_write_bytes(Path(out), figure_bytes(lambda f: small.save(f, format="PNG", optimize=True)))
    return len(ids), shown


def _sheet_row(img, d, fonts, y: int, image_id: int, runs: list, licence: tuple[str, str]) -> None:
    """One photo (or the grey box of a photo not shown) and each run's captions of it."""
    from rdpp_cli.captioning.contact_sheet import thumbnail

    font, bold = fonts
    if licence[0] in SHOWABLE:
        im = thumbnail(Path(runs[0][1][image_id]["file"]), THUMB)
        img.paste(im, (PAD + (THUMB - im.width) // 2, y + (THUMB - im.height) // 2))
    else:
        d.rectangle([PAD, y, PAD + THUMB, y + THUMB], fill=(225, 225, 225))
        for j, text in enumerate(("photo not shown;", "licence", short(licence[0]))):
            d.text((PAD + 8, y + 50 + j * LINE), text, fill=(90, 90, 90), font=font)
    d.text((PAD, y + THUMB + 2), f"COCO {image_id}", fill=(90, 90, 90), font=font)
    for c, (label, res) in enumerate(runs):
        x = PAD + THUMB + PAD + c * COL
        d.text((x, y), label, fill=(30, 60, 150), font=bold)
        for j, cap in enumerate(res[image_id]["captions"][:5]):
            text = cap if d.textlength(cap, font=font) < COL - 20 else cap[:60] + "…"
            d.text((x, y + 20 + j * LINE), f"{j + 1}. {text}", fill="black", font=font)
