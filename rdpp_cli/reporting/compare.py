"""`rdpp compare`: the models' caption sets side by side, per image (docs/compare.md).

Reads samples artifacts (or scores artifacts, followed to their samples) made from one data
artifact's split; scores every caption as `rdpp score` does (PTB tokens, CIDEr-D with the
references' document frequencies; each set's oracle, mean and self-CIDEr with the training df)
and writes one HTML page with its thumbnails and data files (``compare_page``), and with
``--figure`` the chosen images in the supplement's layout (``compare_figure``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rdpp_cli.artifacts import (Artifact, finish, follow_input, list_artifacts, prepare_output, ref_name, resolve_input,
                                sha256_file, workspace_dir, write_manifest)
from rdpp_cli.console import console, info, note, summary_table
from rdpp_cli.errors import RdppError
from rdpp_cli.options import takes
from rdpp_cli.reporting.options import CompareOptions, name_list
from rdpp_cli.reporting.report import Num, Table

MAKE_SAMPLES = "rdpp sample --n 10 --method random"


@dataclass
class ModelSet:
    """One model's captions of the compared images: ``captions[i]`` are the captions shown for image
    i (every candidate when a ``--select`` run kept them, else its set), ``chosen[i]`` the indices of
    the set's captions among them; the scores are filled in by ``score_sets``."""

    label: str
    samples: Artifact
    captions: list[list[str]]
    chosen: list[list[int]]
    selection: str | None = None
    cider: list[np.ndarray] = field(default_factory=list)
    mean: np.ndarray | None = None
    oracle: np.ndarray | None = None
    self_cider: np.ndarray | None = None
    summary: dict = field(default_factory=dict)


@dataclass
class Comparison:
    """What the page and the figure show: the images (ids, data rows, photo files), their references
    and every model's set."""

    data: Artifact
    split: str
    image_ids: list[int]
    references: list[list[str]]
    photos: list[Path | None]
    photo_note: str
    sets: list[ModelSet]
    photo_why: list[str | None] = field(default_factory=list)  # per image: why no photo is shown (None: shown)
    human: dict | None = None
    tradeoff: np.ndarray | None = None
    pair: np.ndarray | None = None


# ---- inputs ---------------------------------------------------------------------------------------

def _samples_of(given: str, workspace) -> Artifact:
    """A samples artifact named or given as a path, or the samples a scores artifact scored."""
    art = resolve_input(given, workspace=workspace, groups=("samples", "scores"), kind=("rdpp.samples", "rdpp.scores"),
                        what="samples or scores artifact", make_with=MAKE_SAMPLES, option="SAMPLES")
    if art.kind == "rdpp.samples":
        return art
    found = follow_input(art, "rdpp.samples", None, workspace=workspace, what="samples", make_with=MAKE_SAMPLES,
                         refused="", quiet=True)
    if found is None:
        raise RdppError(f"scores artifact {art.path} scored a JSON file, not a samples artifact; pass the samples "
                        "artifact itself")
    return found


def _data_sha(art: Artifact) -> str:
    entry = art.input_of_kind("rdpp.data")
    if entry is None or not entry.get("manifest_sha256"):
        raise RdppError(f"samples artifact {art.path} records no data artifact among its inputs; remake it with "
                        "`rdpp sample`")
    return entry["manifest_sha256"]


def _default_samples(workspace, split: str) -> list[Artifact]:
    """Every samples artifact of the newest data artifact's ``split``, oldest first."""
    ws = workspace_dir(workspace)
    data = list_artifacts(ws, ("data",))
    if not data:
        raise RdppError(f"no data artifact in workspace {ws}; pass samples artifacts, or make them with "
                        f"`rdpp prepro toy` and `{MAKE_SAMPLES}`")
    newest = data[-1]
    arts = [a for a in list_artifacts(ws, ("samples",))
            if a.input_of_kind("rdpp.data") and _data_sha(a) == newest.manifest_sha256 and a.config.get("split") == split]
    if not arts:
        raise RdppError(f"no samples artifact of data artifact {newest.name}'s {split} split in {ws}; make them with "
                        f"`{MAKE_SAMPLES} --split {split}`, or pass samples artifacts")
    return arts


def _model_name(art: Artifact) -> str | None:
    return (art.input_of_kind("rdpp.model") or {}).get("name")


def _pick(arts: list[Artifact], names: list[str]) -> list[Artifact]:
    """The samples ``names`` picks, in its order: each the name of a samples artifact or its model's."""
    picked = []
    for name in names:
        hits = [a for a in arts if name in (a.name, _model_name(a))]
        if not hits:
            have = ", ".join(a.name for a in arts)
            raise RdppError(f"--models: no samples artifact named {name} nor sampled from a model of that name (have: "
                            f"{have}); pass one of those names")
        if len(hits) > 1:
            raise RdppError(f"--models: {name} names {len(hits)} samples artifacts ({', '.join(a.name for a in hits)}); "
                            "name the samples artifact instead")
        picked.append(hits[0])
    return picked


def resolve_samples(opts: CompareOptions) -> list[Artifact]:
    """The samples artifacts to compare, in the page's order; refuses an empty selection, a repeat,
    and samples of different data artifacts or splits."""
    arts = [_samples_of(s, opts.workspace) for s in opts.samples] if opts.samples else _default_samples(
        opts.workspace, opts.split)
    if name_list(opts.models):
        arts = _pick(arts, name_list(opts.models))
    if not arts:
        raise RdppError("nothing to compare: the selection is empty; pass samples artifacts or --models names")
    seen: dict[str, Artifact] = {}
    for a in arts:
        if a.manifest_sha256 in seen:
            raise RdppError(f"samples artifact {a.path} is given twice; give each once")
        seen[a.manifest_sha256] = a
    first = arts[0]
    for a in arts[1:]:
        if _data_sha(a) != _data_sha(first):
            raise RdppError(f"{a.name} and {first.name} were sampled from different data artifacts "
                            f"({(a.input_of_kind('rdpp.data') or {}).get('name')} and "
                            f"{(first.input_of_kind('rdpp.data') or {}).get('name')}); compare samples of one data artifact")
        if a.config.get("split") != first.config.get("split"):
            raise RdppError(f"{a.name} holds the {a.config.get('split')} split, {first.name} the "
                            f"{first.config.get('split')} split; compare samples of one split")
    return arts


def _read_records(art: Artifact) -> dict[int, dict]:
    path = art.file("samples.json")
    records = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(records, list) or not records:
        raise RdppError(f"{path} holds no samples; remake it with `rdpp sample`")
    return {int(r["image_id"]): r for r in records}


def _model_set(label: str, art: Artifact, records: dict[int, dict], ids: list[int]) -> ModelSet:
    """The captions shown for ``ids``: a --select run's candidates with its chosen ones, else its set."""
    cfg = art.config
    kept = all("candidates" in records[i] and "chosen" in records[i] for i in ids)
    if kept:
        captions = [list(records[i]["candidates"]) for i in ids]
        chosen = [[int(j) for j in records[i]["chosen"]] for i in ids]
    else:
        captions = [list(records[i]["captions"]) for i in ids]
        chosen = [list(range(len(c))) for c in captions]
    selection = None
    if cfg.get("select"):
        selection = (f"--select {cfg['select']}: {cfg.get('n')} of {cfg.get('candidates')} candidates"
                     + ("" if kept else " (the candidates were not kept: only the chosen ones are shown)"))
    return ModelSet(label, art, captions, chosen, selection)


def load_sets(arts: list[Artifact], labels: list[str] | None, ds) -> tuple[list[int], list[int], list[ModelSet]]:
    """The images every artifact holds (in the data's order: ids and data rows) and each model's set."""
    records = [_read_records(a) for a in arts]
    common = set(records[0]).intersection(*records[1:])
    rows = [int(r) for r in ds.split_indices(arts[0].config.get("split") or "test")]
    rows = [r for r in rows if int(ds.image_ids[r]) in common]
    if not rows:
        raise RdppError(f"the samples {', '.join(a.name for a in arts)} share no image of the data's split; compare "
                        "samples of the same images")
    if any(len(r) != len(rows) for r in records):
        note(f"comparing the {len(rows)} images every samples artifact holds")
    ids = [int(ds.image_ids[r]) for r in rows]
    labels = labels or [a.name for a in arts]
    if len(set(labels)) != len(labels):
        raise RdppError(f"two models would share the label {labels!r}; name them with --labels")
    return ids, rows, [_model_set(lab, a, rec, ids) for lab, a, rec in zip(labels, arts, records)]


# ---- photos ---------------------------------------------------------------------------------------

def _dataset_file(data: Artifact) -> tuple[Path | None, Path | None]:
    """The Karpathy-form dataset the data artifact was made from and the folder its paths start in."""
    cfg = data.config
    files = data.manifest.get("files", {})
    if cfg.get("source") == "toy" and "source/dataset_toy.json" in files:
        return data.file("source/dataset_toy.json"), data.path / "source"
    root = Path(cfg["images_root"]) if cfg.get("images_root") else None
    if "dataset.json" in files:
        return data.file("dataset.json"), root
    return (Path(cfg["karpathy_json"]) if cfg.get("karpathy_json") else None), root


MISMATCH = "the photo does not match the data (its sha256 is not the one the data artifact recorded)"


def _recorded_sha(data: Artifact, root: Path | None, where: dict[int, str]) -> dict[int, str]:
    """The sha256 the data artifact's manifest records for each image's photo (toy data keeps its
    photos among its files; photos outside the artifact are not recorded)."""
    files = data.manifest.get("files", {})
    if root is None:
        return {}
    try:
        base = Path(root).resolve().relative_to(data.path.resolve())
    except ValueError:
        return {}
    out = {}
    for iid, rel in where.items():
        entry = files.get((base / rel).as_posix())
        if isinstance(entry, dict) and entry.get("sha256"):
            out[iid] = entry["sha256"]
    return out


def photo_paths(data: Artifact, ids: list[int], photos: Path | None) -> tuple[list[Path | None], str, list[str | None]]:
    """Each image's photo file (None where it is not found or is not the photo the data recorded), a
    line on what is missing, and per image ``MISMATCH`` where a photo was found but its sha256 is not
    the one the data's manifest records (None elsewhere); with ``photos`` (the folder they moved to),
    every photo must be there."""
    if data.config.get("features_from"):
        return [None] * len(ids), "the data's features were imported (--features-from): it records no photos", \
            [None] * len(ids)
    dataset, root = _dataset_file(data)
    if dataset is None or not dataset.is_file():
        why = f"the data artifact records no caption file with the photos' names ({dataset or '-'})"
        return [None] * len(ids), why, [None] * len(ids)
    wanted = set(ids)
    where: dict[int, str] = {}
    for img in json.loads(dataset.read_text(encoding="utf-8")).get("images", []):
        iid = img.get("cocoid", img.get("id", img.get("imgid")))
        if iid in wanted and img.get("filename"):
            where[iid] = "/".join(p for p in (img.get("filepath") or "", img["filename"]) if p)
    recorded = _recorded_sha(data, root, where)
    root = Path(photos) if photos is not None else root
    paths = [root / where[i] if root is not None and i in where else None for i in ids]
    found = [p if p is not None and p.is_file() else None for p in paths]
    missing = [i for i, p in zip(ids, found) if p is None]
    if photos is not None and missing:
        k = ids.index(missing[0])
        raise RdppError(f"{len(missing)} of the {len(ids)} photos are not under --photos {photos} (e.g. image "
                        f"{missing[0]}: {paths[k] or 'no file name recorded'}); pass the folder that holds them")
    why: list[str | None] = [None] * len(ids)
    for k, (i, p) in enumerate(zip(ids, found)):
        if p is not None and i in recorded and sha256_file(p) != recorded[i]:
            found[k], why[k] = None, MISMATCH
    notes = [f"{len(missing)} of {len(ids)} photos not found under {root}"] if missing else []
    wrong = sum(w == MISMATCH for w in why)
    if wrong:
        notes.append(f"{wrong} of {len(ids)} photos under {root} are not the data's: their sha256 differs from "
                     "the one the data artifact recorded")
    return found, "; ".join(notes) + (" (placeholders shown)" if notes else ""), why


def read_figure_ids(path: Path, ids: list[int]) -> list[int]:
    """The image ids a ``--figure`` file names (one a line, ``#`` comments), each one compared."""
    if not Path(path).is_file():
        raise RdppError(f"--figure {path} does not exist; pass a text file of image ids, one a line")
    wanted = []
    for k, line in enumerate(Path(path).read_text(encoding="utf-8-sig").splitlines(), 1):  # a BOM is no id
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not text.isdigit():
            raise RdppError(f"--figure {path}, line {k}: {text!r} is not an image id; write one integer id a line")
        if int(text) not in ids:
            raise RdppError(f"--figure {path}, line {k}: image {text} is not among the {len(ids)} compared images; "
                            "name images of the samples' split")
        wanted.append(int(text))
    if not wanted:
        raise RdppError(f"--figure {path} names no image; write one image id a line")
    return wanted


# ---- scores ---------------------------------------------------------------------------------------

def _split(flat: list, counts: list[int]) -> list[list]:
    out, k = [], 0
    for n in counts:
        out.append(flat[k:k + n])
        k += n
    return out


def score_sets(cmp: Comparison, ds) -> None:
    """Every caption's CIDEr-D (the compared images' references as `rdpp score` scores them), each
    set's mean, oracle and self-CIDEr, the table's numbers, the human point and the trade-off order."""
    from rdpp_cli.metrics import coco_eval
    from rdpp_cli.metrics import diversity as divstats
    from rdpp_cli.metrics.self_cider import self_cider_ragged
    from rdpp_cli.scoring.score import human_point, self_cider_df

    coco_eval.java()  # one clear line before any work when Java is missing
    flat_refs = [r for rs in cmp.references for r in rs]
    flat_caps = [c for s in cmp.sets for caps in s.captions for c in caps]
    info(f"PTB-tokenizing {len(flat_refs):,} references and {len(flat_caps):,} captions")
    toks = coco_eval.ptb_tokenize(flat_refs + flat_caps)
    tok_refs = _split(toks[:len(flat_refs)], [len(r) for r in cmp.references])
    df, _ = self_cider_df(ds, tok_refs)
    k = len(flat_refs)
    for s in cmp.sets:
        n = sum(len(c) for c in s.captions)
        tok_caps = _split(toks[k:k + n], [len(c) for c in s.captions])
        k += n
        ev = coco_eval.evaluate(tok_caps, tok_refs, metrics=("CIDEr",), tokenize=False)
        s.cider = ev.per_caption["CIDEr"]
        chosen = [c[ch] for c, ch in zip(s.cider, s.chosen)]
        s.mean = np.array([c.mean() for c in chosen])
        s.oracle = np.array([c.max() for c in chosen])
        sets = [[t[j] for j in ch] for t, ch in zip(tok_caps, s.chosen)]
        many = np.array([len(x) >= 2 for x in sets])
        # a set of one caption has no self-CIDEr (NaN: "–"), as `rdpp score` leaves it out
        s.self_cider = np.where(many, self_cider_ragged(sets, df, "cider-d"), np.nan)
        s.summary = {"CIDEr": float(np.concatenate(chosen).mean()), "oracle": float(s.oracle.mean()),
                     "self_cider": float(s.self_cider[many].mean()) if many.any() else None,
                     "div2": float(np.mean(divstats.div_n(sets, 2))),
                     "distinct": float(np.mean(divstats.distinct_captions(sets))),
                     "n": int(np.median([len(x) for x in sets]))}
    cmp.human = human_point(tok_refs, df, "cider-d")
    cmp.tradeoff, cmp.pair = tradeoff(cmp.sets)


def tradeoff(sets: list[ModelSet]) -> tuple[np.ndarray, np.ndarray]:
    """Per image, how clearly one model beats another on both axes of the paper's Fig. 1: the largest,
    over ordered pairs (a, b), of the smaller of a's lead in self-CIDEr and in oracle CIDEr-D (each in
    units of its spread over every model and image); and that pair (a, b). 0 and (-1, -1) for one model,
    and where no pair has both numbers (a one-caption set has no self-CIDEr)."""
    n = len(sets[0].oracle)
    if len(sets) < 2:
        return np.zeros(n), np.full((n, 2), -1)
    div = np.stack([s.self_cider for s in sets])  # NaN where a set has one caption: no lead on that pair
    acc = np.stack([s.oracle for s in sets])
    if np.isnan(div).all():
        return np.zeros(n), np.full((n, 2), -1)
    div, acc = (div - np.nanmean(div)) / (np.nanstd(div) or 1.0), (acc - acc.mean()) / (acc.std() or 1.0)
    best, pair = np.full(n, -np.inf), np.full((n, 2), -1)
    for a in range(len(sets)):
        for b in range(len(sets)):
            if a != b:
                lead = np.minimum(div[a] - div[b], acc[a] - acc[b])
                better = lead > best
                best[better], pair[better] = lead[better], (a, b)
    none = ~np.isfinite(best)  # no pair with both numbers (one-caption sets)
    best[none], pair[none] = 0.0, -1
    return best, pair


def numbers_table(cmp: Comparison) -> Table:
    """The `rdpp table`-style numbers of every set on the compared images."""
    t = Table(["model", "captions per image", "mean CIDEr-D", "oracle CIDEr-D", "self-CIDEr", "Div-2",
               "distinct captions"], align="lrrrrrr")
    for s in cmp.sets:
        m = s.summary
        t.rows.append([s.label, Num(m["n"], "d"), Num(m["CIDEr"]), Num(m["oracle"]), Num(m["self_cider"]),
                       Num(m["div2"]), Num(m["distinct"], ".2f")])
    if cmp.human:
        t.rows.append(["human references (leave-one-out)", "", Num(cmp.human["cider_leave_one_out"]), "",
                       Num(cmp.human["self_cider"]), "", ""])
    return t


# ---- the stage ------------------------------------------------------------------------------------

def claim(opts: CompareOptions, data: Artifact, split: str, arts: list[Artifact], reads: list[Path]) -> Path:
    """The artifact folder the page goes to: ``--out`` or a new version ``<workspace>/compare/<data>-<split>-v<k>``
    (``artifacts.prepare_output``: an unfinished page with the same inputs and settings is redone in
    its folder; ``--out`` over another compare page needs ``--force``; anything it reads is refused)."""
    identity = {"data_sha256": data.manifest_sha256, "split": split,
                "samples_sha256": [a.manifest_sha256 for a in arts], **opts.identity()}
    return prepare_output(opts.out, workspace=opts.workspace, group="compare", name=f"{data.name}-{split}",
                          kind="rdpp.compare", config=identity, force=opts.force, reads=reads)


@takes(CompareOptions)
def compare(opts: CompareOptions) -> Path:
    """Write the compare page of ``opts.samples`` (and with ``opts.figure`` the figure); returns its folder."""
    from rdpp_cli.data.dataset import DataArtifact
    from rdpp_cli.reporting.compare_page import write_page

    arts = resolve_samples(opts)
    data = follow_input(arts[0], "rdpp.data", None, workspace=opts.workspace, what="data artifact",
                        make_with="rdpp prepro toy", refused="", quiet=True)
    ds = DataArtifact(data)
    split = arts[0].config.get("split") or "test"
    ids, rows, sets = load_sets(arts, name_list(opts.labels), ds)
    figure_ids = read_figure_ids(opts.figure, ids) if opts.figure is not None else None
    photos, photo_note, photo_why = photo_paths(data, ids, opts.photos)
    lost = [i for i in figure_ids or [] if photos[ids.index(i)] is None and photo_why[ids.index(i)] is None]
    if lost and data.config.get("features_from") is None:
        missing = lost[0]
        raise RdppError(f"--figure: the photo of image {missing} is not found ({photo_note}); pass --photos DIR "
                        "with the data's photos, or leave that image out")
    cmp = Comparison(data, split, ids, ds.references_raw(rows), photos, photo_note, sets, photo_why)
    out = claim(opts, data, split, arts, [data.path, *(a.path for a in arts), *(p for p in [opts.figure] if p)])
    score_sets(cmp, ds)
    record = {"data": ref_name(data), "split": split, "images": len(ids), "options": opts.recorded(),
              "models": [{"label": s.label, "samples": ref_name(s.samples), "manifest_sha256": s.samples.manifest_sha256}
                         for s in sets]}
    figure = None
    if figure_ids:
        from rdpp_cli.reporting.compare_figure import draw_figure

        figure = lambda folder: draw_figure(cmp, figure_ids, folder / f"figure.{opts.figure_format}", opts.figure_format,  # noqa: E731
                                            opts.figure_captions)
    write_page(cmp, out, numbers_table(cmp), record, opts.per_page, figure)
    summary = {"images": len(ids), "models": [s.label for s in sets],
               **{f"oracle {s.label}": s.summary["oracle"] for s in sets}}
    write_manifest(out, "rdpp.compare", {**record["options"], "data": record["data"], "split": split,
                                         "figure_images": len(figure_ids or [])},
                   inputs=[data, *arts], summary=summary)
    finish(out)
    _print_summary(cmp, out, photo_note, figure_ids, opts.figure_format)
    return out


def _print_summary(cmp: Comparison, out: Path, photo_note: str, figure_ids, fmt: str) -> None:
    shown = sum(p is not None for p in cmp.photos)
    rows = {"page": out / "index.html", "images": f"{len(cmp.image_ids):,} ({cmp.data.name}, {cmp.split} split)",
            "photos": f"{shown:,} of {len(cmp.image_ids):,}" + (f" ({photo_note})" if photo_note else ""),
            **{s.label: f"oracle {s.summary['oracle']:.3f} · self-CIDEr {_three(s.summary['self_cider'])} · "
                        f"{ref_name(s.samples)}" for s in cmp.sets}}
    if figure_ids:
        rows["figure"] = f"{out / f'figure.{fmt}'} ({len(figure_ids)} images)"
    console.print(summary_table("rdpp compare", rows))


def _three(x: float | None) -> str:
    """Three decimals, "–" for None (a one-caption set's self-CIDEr, as the table shows it)."""
    return "–" if x is None else f"{x:.3f}"
