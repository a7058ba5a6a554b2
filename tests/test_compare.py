"""`rdpp compare`: the page's files and numbers (against `rdpp score`), escaping, the figure, the
refusals, and the page in headless Chromium (skipped where Debian's chromium is not installed)."""

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import error_line, listing, model_artifact, rdpp

from rdpp_cli.artifacts import finish, prepare_output, write_manifest
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.decoding.sample import sample
from rdpp_cli.scoring.score import score

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

NASTY = ['a <b>red</b> & "blue" circle', "café’s 東京 square", "</script><script>alert(1)</script>", "x", "it's $x$"]


def _hand_samples(ws: Path, model, data, captions: dict[int, list[str]], name: str, split: str = "test"):
    """A samples artifact holding ``captions`` (image id -> captions), as `rdpp sample` records one."""
    cfg = {"split": split, "method": "random", "n": 5}
    out = prepare_output(None, workspace=ws, group="samples", name=name, kind="rdpp.samples", config=cfg)
    recs = [{"image_id": i, "captions": c, "logprobs": [-1.0] * len(c)} for i, c in captions.items()]
    (out / "samples.json").write_text(json.dumps(recs), encoding="utf-8")
    art = write_manifest(out, "rdpp.samples", cfg, inputs=[model, data])
    finish(out)
    return art


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The bundled toy set (60 images, 6 test photos), three small models' random samples (n=5)
    and one model's set of captions that need escaping."""
    ws = tmp_path_factory.mktemp("ws")
    data = prepro_toy(workspace=ws, images=60, seed=3)
    arts = []
    for k, (group, name) in enumerate([("xe", "xe"), ("finetune", "scst"), ("finetune", "dpp")]):
        model = model_artifact(ws, data, group=group, name=name, seed=k)
        arts.append(sample(model.path, workspace=ws, n=5, seed=k, device="cpu"))
    test_ids = [r["image_id"] for r in json.loads((arts[0].path / "samples.json").read_text())]
    nasty = _hand_samples(ws, model, data, {i: NASTY for i in test_ids}, "nasty")
    return ws, data, arts, nasty, test_ids


def _page(folder: Path) -> tuple[dict, list[dict]]:
    """The page's index and its data records, in the trade-off order."""
    text = (folder / "index.html").read_text(encoding="utf-8")
    index = json.loads(re.search(r'<script id="rdpp-index" type="application/json">(.*?)</script>', text, re.S)[1])
    recs = []
    for f in sorted((folder / "data").glob("chunk-*.js")):
        recs += json.loads(re.fullmatch(r"rdppChunk\(\d+,(.*)\);\n", f.read_text(), re.S)[1])
    return index, recs


def test_page_holds_every_image_and_the_numbers_of_rdpp_score(ws, tmp_path):
    root, data, arts, _, test_ids = ws
    out = tmp_path / "page"
    r = rdpp("compare", *(a.path for a in arts), "--labels", "XE,SCST,R-DPP", "--out", out, "--workspace", root)
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["compare.json", "data", "index.html", "manifest.json", "plot.png",
                                                     "table.md", "thumbs"]
    manifest = json.loads((out / "manifest.json").read_text())  # a complete artifact, its inputs recorded
    assert manifest["kind"] == "rdpp.compare" and len(manifest["inputs"]) == 4
    index, recs = _page(out)
    assert index["models"] == ["XE", "SCST", "R-DPP"]
    assert sorted(row[0] for row in index["images"]) == sorted(test_ids)
    assert sorted(p.name for p in (out / "thumbs").iterdir()) == sorted(f"{i}.jpg" for i in test_ids)
    trade = [row[4] for row in index["images"]]
    assert trade == sorted(trade, reverse=True)  # opens with the clearest trade-off
    # the SCST set's per-caption CIDEr-D, oracle and self-CIDEr are those of `rdpp score`
    scored = score(arts[1].path, oracle=True, self_cider=True, metrics="CIDEr", workspace=root)
    with open(scored / "per_image.csv") as f:
        per = {int(row["image_id"]): row for row in csv.DictReader(f)}
    for row, rec in zip(index["images"], recs):
        caps, cider, chosen = rec["s"][1]
        assert chosen == [0, 1, 2, 3, 4] and len(caps) == 5
        assert np.mean(cider) == pytest.approx(float(per[row[0]]["CIDEr"]), abs=2e-3)
        assert row[7][3:6] == pytest.approx([float(per[row[0]][k]) for k in ("CIDEr", "CIDEr_oracle", "self_cider")],
                                            abs=1e-3)
    totals = json.loads((scored / "scores.json").read_text())
    table = (out / "table.md").read_text()
    assert f"| SCST | 5 | {totals['accuracy']['CIDEr']:.3f} | {totals['oracle']['CIDEr']:.3f} | " \
           f"{totals['diversity']['self_cider']:.3f} |" in table
    assert json.loads((out / "compare.json").read_text())["models"][2]["samples"] == f"samples/{arts[2].name}"


def test_captions_and_labels_are_escaped_and_the_figure_is_drawn(ws, tmp_path):
    root, data, arts, nasty, test_ids = ws
    ids = tmp_path / "ids.txt"
    ids.write_text(f"# two images\n{test_ids[1]}\n{test_ids[0]}  # and this one\n")
    out = tmp_path / "page"
    r = rdpp("compare", arts[0].path, nasty.path, "--labels", 'XE,<i>odd</i> & "model"', "--out", out,
             "--figure", ids, "--format", "svg", "--workspace", root)
    assert r.exit_code == 0, r.output
    text = (out / "index.html").read_text(encoding="utf-8")
    assert "<b>" not in text and "alert(1)</script>" not in text and "<i>odd" not in text
    assert "&lt;i&gt;odd&lt;/i&gt; &amp; &quot;model&quot;" in text  # the label in the table, as text
    index, recs = _page(out)
    assert index["models"][1] == '<i>odd</i> & "model"' and recs[0]["s"][1][0] == NASTY
    svg = (out / "figure.svg").read_text(encoding="utf-8")
    for s in ("1. a &lt;b&gt;red&lt;/b&gt; &amp; &quot;blue&quot; circle", "2. café’s 東京 square", "5. it's $x$"):
        assert s.replace("&quot;", '"') in svg or s in svg
    assert svg.index(f"image {test_ids[1]}") < svg.index(f"image {test_ids[0]}")  # in the file's order


def test_pdf_figure_and_a_second_run_is_a_new_version(ws, tmp_path):
    root, data, arts, _, test_ids = ws
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(map(str, test_ids[:4])))
    for _ in range(2):
        r = rdpp("compare", *(a.path for a in arts), "--figure", ids, "--format", "pdf", "--workspace", root)
        assert r.exit_code == 0, r.output
    first, second = (root / "compare" / f"{data.name}-test-v{k}" for k in (1, 2))
    assert (first / "figure.pdf").read_bytes()[:5] == b"%PDF-" and (second / "figure.pdf").is_file()
    assert sorted(p.name for p in (root / "compare").iterdir()) == [first.name, second.name]  # nothing else left
    assert "compare/" + first.name in rdpp("ls", "--workspace", root).output


def _refusals(ws, tmp_path):
    root, data, arts, nasty, test_ids = ws
    other = prepro_toy(workspace=tmp_path / "other", images=40, seed=4)
    model = model_artifact(tmp_path / "other", other, name="o")
    foreign = sample(model.path, workspace=tmp_path / "other", n=2, device="cpu")
    val = sample(root / "xe" / "xe-v1", workspace=root, n=2, split="val", device="cpu",
                 out=tmp_path / "val")
    bad_ids = tmp_path / "bad.txt"
    bad_ids.write_text("123456\n")
    empty = tmp_path / "photos"
    empty.mkdir()
    return {
        "other data": ([arts[0].path, foreign.path], "were sampled from different data artifacts"),
        "other split": ([arts[0].path, val.path], "holds the val split"),
        "empty selection": ([arts[0].path, "--models", ","], "name nothing"),
        "unknown model": (["--models", "nope"], "no samples artifact named nope"),
        "missing photos": ([arts[0].path, "--photos", empty], "photos are not under --photos"),
        "id not compared": ([arts[0].path, "--figure", bad_ids], "image 123456 is not among the 6 compared"),
        "twice": ([arts[0].path, arts[0].path], "is given twice"),
    }


def test_bad_input_is_one_line_exit_2_and_nothing_written(ws, tmp_path):
    root = ws[0]
    for what, (args, match) in _refusals(ws, tmp_path).items():
        before = listing(root)
        r = rdpp("compare", *args, "--workspace", root, "--out", tmp_path / "out")
        assert match in error_line(r), (what, r.output)
        assert listing(root) == before and not (tmp_path / "out").exists(), what


# ---- the page in a browser ---------------------------------------------------------------------------

def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _dump(page: Path, hash_: str = "") -> str:
    """The page's DOM after its scripts ran, opened at ``#hash_`` (the sort and filter it shows)."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,30000",
           "--virtual-time-budget=4000", "--dump-dom", page.as_uri() + (f"#{hash_}" if hash_ else "")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


def _root_attrs(dom: str) -> dict:
    return dict(re.findall(r'(data-[a-z]+)="([^"]*)"', re.search(r"<html[^>]*>", dom)[0]))


@pytest.mark.slow  # six Chromium launches: 10-50 s
@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed (Debian: apt-get install chromium)")
def test_page_in_chromium_loads_every_image_and_sorts_and_filters(ws, tmp_path):
    root, data, arts, nasty, test_ids = ws
    out = tmp_path / "page"
    r = rdpp("compare", *(a.path for a in arts), nasty.path, "--labels", "XE,SCST,R-DPP,<odd>", "--out", out,
             "--per-page", "4", "--workspace", root)
    assert r.exit_code == 0, r.output
    index, recs = _page(out)
    rows = index["images"]
    page = out / "index.html"
    dom = _dump(page)
    attrs = _root_attrs(dom)
    assert attrs["data-state"] == "ready" and "data-errors" not in attrs, attrs  # no error, every file found
    assert attrs["data-shown"] == ",".join(str(r[0]) for r in rows[:4])  # the trade-off order, 4 a page
    srcs = re.findall(r'<img[^>]* src="(thumbs/[^"]+)"', dom)
    assert len(srcs) == 4 and all((out / s).is_file() for s in srcs)
    assert "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "café’s 東京 square" in dom
    by_id = _root_attrs(_dump(page, "sort=id&page=1"))
    assert by_id["data-shown"] == ",".join(map(str, sorted(test_ids)[4:8]))
    lead = sorted(rows, key=lambda r: (-(r[7][2] - r[7][5]), r[0]))  # self-CIDEr of XE minus SCST's
    diff = _root_attrs(_dump(page, "sort=diff&metric=2&a=0&b=1"))
    assert diff["data-shown"] == ",".join(str(r[0]) for r in lead[:4])
    word = next(w for w in rows[0][8].split() if sum(w in r[8].split() for r in rows) < len(rows))
    hits = [str(r[0]) for r in rows if word in r[8].split()]
    filtered = _dump(page, f"word={word}&sort=id")
    assert _root_attrs(filtered)["data-shown"] == ",".join(sorted(hits, key=int)[:4])
    assert f"<mark>{word}</mark>" in filtered.lower()
    assert _root_attrs(_dump(page, f"id={test_ids[2]}"))["data-shown"] == str(test_ids[2])


def test_the_figure_never_prints_minus_zero():
    """Identical captions' self-CIDEr is 0 up to float rounding, sometimes -1e-16: the figure says 0.00."""
    from rdpp_cli.reporting.compare_figure import _num

    assert (_num(-1e-16), _num(0.004), _num(-0.5), _num(0.653)) == ("0.00", "0.00", "-0.50", "0.65")


def test_format_without_a_figure_is_refused_and_the_format_is_recorded_only_with_one(tmp_path):
    """Issue 36: --format sets the --figure drawing's format; alone it cannot act: one line, exit 2."""
    from rdpp_cli.errors import RdppError
    from rdpp_cli.reporting.options import CompareOptions

    with pytest.raises(RdppError, match="--format png is the format of the --figure drawing, and no --figure "
                                        "was given; pass --figure IDS_FILE or drop --format"):
        CompareOptions(samples=["a"], format="png")
    assert CompareOptions(samples=["a"]).recorded()["format"] is None
    (tmp_path / "ids.txt").write_text("1\n")  # --figure must be a readable file of ids
    assert CompareOptions(samples=["a"], figure=tmp_path / "ids.txt").recorded()["format"] == "pdf"
    assert CompareOptions(samples=["a"], figure=tmp_path / "ids.txt", format="svg").figure_format == "svg"


def _swap_photos(source: Path, a: int, b: int) -> None:
    """Swap the files of images ``a`` and ``b`` in a toy data's ``source`` folder (names kept)."""
    names = {img["cocoid"]: Path(img["filepath"]) / img["filename"]
             for img in json.loads((source / "dataset_toy.json").read_text())["images"]}
    pa, pb = source / names[a], source / names[b]
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)


def test_swapped_photos_show_the_placeholder_not_another_images_photo(ws, tmp_path):
    """Two photos swapped (in a --photos folder with the same names, or in the data's own source
    folder): their sha256 is not the one the data's manifest records, so neither is shown under the
    other's captions (page, figure); each says its photo does not match, the other photos show."""
    from rdpp_cli.artifacts import read_artifact
    from rdpp_cli.reporting.compare import MISMATCH, photo_paths

    root, data, arts, _, test_ids = ws
    a, b = test_ids[:2]
    photos = tmp_path / "photos"
    shutil.copytree(data.path / "source", photos)
    _swap_photos(photos, a, b)
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{a}\n{test_ids[2]}\n")
    out = tmp_path / "page"
    r = rdpp("compare", arts[0].path, "--photos", photos, "--figure", ids, "--format", "png", "--out", out,
             "--workspace", root)
    assert r.exit_code == 0, r.output
    assert "are not the data's" in " ".join(r.output.split())
    index, recs = _page(out)
    for row, rec in zip(index["images"], recs):
        swapped = row[0] in (a, b)
        assert row[1] == (None if swapped else f"thumbs/{row[0]}.jpg"), row[0]
        assert rec.get("w") == (MISMATCH if swapped else None), row[0]
    assert sorted(p.name for p in (out / "thumbs").iterdir()) == sorted(f"{i}.jpg" for i in test_ids[2:])
    assert (out / "figure.png").is_file()
    # the same two swapped in the data's own folder (a copy of the artifact)
    copy = tmp_path / "data-copy"
    shutil.copytree(data.path, copy)
    _swap_photos(copy / "source", a, b)
    found, note, why = photo_paths(read_artifact(copy), test_ids, None)
    assert [w == MISMATCH for w in why] == [i in (a, b) for i in test_ids]
    assert [p is None for p in found] == [i in (a, b) for i in test_ids] and "2 of 6 photos" in note
    found, note, why = photo_paths(data, test_ids, None)  # the intact data: every photo, no note
    assert all(p is not None for p in found) and note == "" and why == [None] * len(test_ids)


def test_a_one_caption_set_has_no_self_cider_anywhere_and_the_plot_says_it_left_it_out(ws, tmp_path):
    """`rdpp score` gives a one-caption set's self-CIDEr as null; compare's table, page, figure and
    terminal show "–" (not 0.00), and its plot names the model it left out and why."""
    from rdpp_cli.artifacts import read_artifact
    from rdpp_cli.reporting.compare_figure import _num

    root, data, arts, _, test_ids = ws
    one = _hand_samples(root, read_artifact(root / "xe" / "xe-v1"), data,
                        {i: ["a red circle"] for i in test_ids}, "one-caption")
    scored = score(one.path, oracle=True, self_cider=True, metrics="CIDEr", workspace=root)
    assert json.loads((scored / "scores.json").read_text())["diversity"]["self_cider"] is None
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{test_ids[0]}\n")
    out = tmp_path / "page"
    r = rdpp("compare", arts[0].path, one.path, "--labels", "five,one", "--figure", ids, "--format", "png",
             "--out", out, "--workspace", root)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "self-CIDEr – ·" in text and "self-CIDEr 0.000" not in text
    assert "one (one caption per image: self-CIDEr needs at least 2); not plotted" in text
    row = next(line for line in (out / "table.md").read_text().splitlines() if line.startswith("| one "))
    assert row.split("|")[5].strip() == "–"
    index, _ = _page(out)
    assert all(r[7][5] is None and r[7][2] is not None for r in index["images"])  # one's self-CIDEr: null
    assert _num(float("nan")) == "–" and _num(-1e-9) == "0.00"
    # the plot carries the note: the same points without the left-out model draw another picture
    from rdpp_cli.scoring.plot import ONE_CAPTION, plot_points

    a = plot_points([("five", 0.5, 1.0), ("one", None, 1.2)], None, tmp_path / "a.png", why={"one": ONE_CAPTION})
    b = plot_points([("five", 0.5, 1.0)], None, tmp_path / "b.png")
    assert a.read_bytes() != b.read_bytes()


@pytest.mark.parametrize("fault", ["interrupt", "full disk"])
def test_a_compare_interrupted_at_the_thumbnails_finishes_when_rerun(ws, tmp_path, monkeypatch, fault):
    """Ctrl-C (or a full disk) while the thumbnails are written left thumbs/ behind, and every rerun
    (--force too) failed on "thumbs: File exists"; the rerun now redoes the page, with every photo.
    A full disk is one error line naming the file, not a thumbnail silently left out."""
    import errno

    from rdpp_cli.captioning import contact_sheet

    root, data, arts, _, test_ids = ws
    real_fdopen, real_thumbnail, calls = os.fdopen, contact_sheet.thumbnail, []

    def thumbnail(*a, **kw):  # Ctrl-C while the third photo is read
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_thumbnail(*a, **kw)

    from helpers import WrappedFile

    class Full(WrappedFile):  # a file on a full disk: its writes fail
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, *a, **kw):  # the disk full when the third thumbnail is written (its temp file)
        f = real_fdopen(fd, *a, **kw)
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if target.parent.name == "thumbs" and ".jpg." in target.name:
            calls.append(target.name)
            if len(calls) == 3:
                return Full(f)
        return f

    out = tmp_path / "page"
    args = ("compare", *(a.path for a in arts[:2]), "--out", out, "--workspace", root)
    with monkeypatch.context() as m:
        if fault == "interrupt":
            m.setattr(contact_sheet, "thumbnail", thumbnail)
        else:
            m.setattr(os, "fdopen", fdopen)
        r = rdpp(*args)
    assert r.exit_code == (130 if fault == "interrupt" else 1), r.output
    if fault == "full disk":
        last = r.output.strip().splitlines()[-1]
        assert last.startswith("error: no space left writing") and "thumbs" in last
    assert (out / "thumbs").is_dir() and not (out / "manifest.json").exists()
    for extra in ((), ("--force",)):
        r = rdpp(*args, *extra)
        assert r.exit_code == 0, r.output
        index, _ = _page(out)
        assert all(row[1] == f"thumbs/{row[0]}.jpg" for row in index["images"])
        assert sorted(p.name for p in (out / "thumbs").iterdir()) == sorted(f"{i}.jpg" for i in test_ids)
