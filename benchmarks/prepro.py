"""`rdpp prepro`'s speed: feature extraction against the reference loop, `prepro toy`'s backbones, `prepro coco`'s text side.

``extract``: ``features.iter_features`` (``--workers`` processes, batches of ``--batches``) against
self-critical.pytorch's ``prepro_feats.py`` loop (one photo at a time, at rdpp's size so that both
compute the same numbers: checked to 1e-3 first) on real photos, MobileNetV2 (docs/data.md
"Extraction speed"). ``toy``: `rdpp prepro toy` with pixstats and with a random resnet18 in fresh
child processes, checked first to write the same captions and different features. ``text``:
``prepro_coco``'s text side in a child process on a Karpathy file of COCO's size resampled from
real captions; each step's seconds and the peak RSS. Interleaved, medians (bests beside);
benchmarks/README.md says more.

    python benchmarks/prepro.py extract|toy|text [--repeats N] [--threads N] [--json]   # each one's --help: the rest
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, print_table, reused, run_bench, subcommands  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
NO_PROGRESS = {**os.environ, "RDPP_NO_PROGRESS": "1"}


# -- extract -------------------------------------------------------------------------------------------

def reference(paths, bb) -> tuple[np.ndarray, np.ndarray]:
    """prepro_feats.py's loop (one image at a time), at rdpp's input size."""
    import torch
    import torch.nn.functional as Fn
    from PIL import Image

    mean, std = torch.tensor(bb.mean).view(3, 1, 1), torch.tensor(bb.std).view(3, 1, 1)
    fcs, atts = [], []
    with torch.no_grad():
        for p in paths:
            img = np.asarray(Image.open(p).resize((bb.image_size, bb.image_size), Image.BILINEAR))
            if img.ndim == 2:  # "handle grayscale input images"
                img = np.concatenate([img[:, :, None]] * 3, axis=2)
            x = (torch.from_numpy(img.astype("float32") / 255.0).permute(2, 0, 1) - mean) / std
            y = bb.module.trunk(x[None])[0]  # my_resnet: the trunk on one image
            fcs.append(y.mean(2).mean(1).numpy())
            atts.append(Fn.adaptive_avg_pool2d(y, [bb.att_size] * 2).permute(1, 2, 0).reshape(-1, y.shape[0]).numpy())
    return np.stack(fcs), np.stack(atts)


def rdpp_extract(paths, bb, workers: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    from rdpp_cli.data import features as F

    fc, att = zip(*F.iter_features(paths, bb, batch_size=batch, device="cpu", workers=workers))
    return np.concatenate(fc), np.concatenate(att)


def bench_extract(args) -> dict:
    import torch

    from rdpp_cli.data import features as F
    from rdpp_cli.data.backbones import build_backbone
    from rdpp_cli.data.karpathy import load_karpathy

    os.environ["RDPP_NO_PROGRESS"] = "1"
    torch.set_num_threads(args.threads or torch.get_num_threads())
    paths = [args.root / "images" / r.relpath for r in load_karpathy(args.root / "dataset_coco390.json")[:args.images]]
    weights = args.weights if args.weights.is_file() else None
    bb = build_backbone("mobilenet_v2", att_size=args.image_size // 32, image_size=args.image_size,
                        weights=weights, pretrained=False)
    (rfc, ratt), (ofc, oatt) = reference(paths[:4], bb), rdpp_extract(paths[:4], bb, 0, 4)  # the same numbers first
    assert np.allclose(rfc, ofc, atol=1e-3) and np.allclose(ratt, oatt, atol=1e-3), "rdpp != reference"
    sides = {"reference (1 image at a time)": lambda: reference(paths, bb)}
    for w in sorted({F.default_workers("cpu") if w == "default" else int(w) for w in args.workers.split(",")}):
        for b in map(int, args.batches.split(",")):
            sides[f"rdpp workers={w} batch={b}"] = (lambda w=w, b=b: rdpp_extract(paths, bb, w, b))
    t = interleaved(sides, args.repeats)
    ref = t["reference (1 image at a time)"].median
    return {"images": len(paths), "image_size": args.image_size, "att_size": bb.att_size, "dim": bb.dim,
            "weights": str(weights) if weights else "random init", "threads": torch.get_num_threads(),
            "cores": len(os.sched_getaffinity(0)), "default_workers": F.default_workers("cpu"),
            "rows": {k: {"median_s": v.median, "images_per_s": len(paths) / v.median, "speedup": ref / v.median}
                     for k, v in t.items()}}


def show_extract(res: dict, args) -> None:
    print_table(f"feature extraction, mobilenet_v2 {res['image_size']}px -> {res['att_size']}x{res['att_size']}x"
                f"{res['dim']}, {res['images']} real COCO photos, CPU, {res['threads']} torch threads, {res['cores']} "
                f"cores (default workers {res['default_workers']}), median of {args.repeats}",
                ["loop", "images/s", "vs reference"],
                [[k, f"{r['images_per_s']:.2f}", f"{r['speedup']:.2f}x"] for k, r in res["rows"].items()])


# -- toy -----------------------------------------------------------------------------------------------

def prepro_toy(out: Path, backbone: str, images: int, env: dict) -> float:
    """One ``rdpp prepro toy`` in a child process; returns its CPU seconds (user + system)."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "rdpp_cli", "prepro", "toy", "--out", str(out), "--images", str(images),
                    "--backbone", backbone], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_captions(a: Path, b: Path) -> None:
    with h5py.File(a / "captions.h5", "r") as fa, h5py.File(b / "captions.h5", "r") as fb:
        for key in ("labels", "label_start", "label_end", "image_ids", "split"):
            if not np.array_equal(fa[key][...], fb[key][...]):
                raise SystemExit(f"the two backbones' artifacts differ in captions.h5 {key}; not timed")
    with h5py.File(a / "features.h5", "r") as fa, h5py.File(b / "features.h5", "r") as fb:
        if fa["att"].shape == fb["att"].shape and np.array_equal(fa["att"][...], fb["att"][...]):
            raise SystemExit("the two backbones wrote the same features; not timed")


def bench_toy(args) -> dict:
    env = {**NO_PROGRESS, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {})}
    backbones = ("pixstats", "resnet18")
    with tempfile.TemporaryDirectory(prefix="rdpp-bench-toy-") as tmp:
        outs = {b: Path(tmp) / b for b in backbones}
        for b in backbones:
            prepro_toy(outs[b], b, args.check_images, env)
        same_captions(*outs.values())
        wall = interleaved({b: (lambda b=b: prepro_toy(outs[b], b, args.images, env)) for b in backbones}, args.repeats,
                           keep=True)  # each run's CPU seconds
        cpu = {b: wall[b].results for b in backbones}
    rows = {b: {"wall_s": round(wall[b].median, 2), "wall_best_s": round(wall[b].best, 2),
                "cpu_s": round(float(np.median(cpu[b])), 2), "cpu_best_s": round(min(cpu[b]), 2)} for b in backbones}
    return {"images": args.images, "repeat": args.repeats, "threads": args.threads, "rows": rows,
            "cpu_ratio": round(rows["resnet18"]["cpu_s"] / rows["pixstats"]["cpu_s"], 2),
            "wall_ratio": round(wall["resnet18"].median / wall["pixstats"].median, 2)}


def show_toy(res: dict, args) -> None:
    print_table(f"rdpp prepro toy --images {res['images']}: {res['repeat']} interleaved runs each, medians (bests), "
                f"OMP_NUM_THREADS={res['threads'] or 'unset'}", ["backbone", "wall s", "CPU s (user + sys)"],
                [[k, f"{r['wall_s']:.1f} ({r['wall_best_s']:.1f})", f"{r['cpu_s']:.1f} ({r['cpu_best_s']:.1f})"]
                 for k, r in res["rows"].items()], width=120)
    print(f"resnet18 / pixstats: {res['cpu_ratio']:.1f}x the CPU time, {res['wall_ratio']:.1f}x the wall time (medians)")


# -- text ----------------------------------------------------------------------------------------------

CAPTION_FILES = (ROOT / "tests/data/coco-val2014-1k/captions_val2014_1k.json",
                 SHARED / "data/coco-real-390/captions_val2017.json")
KARPATHY_SPLITS = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}  # 123,287 images
EXTRA_CAPTION_IMAGES = 332  # Karpathy's file: 616,767 sentences = 5 × 123,287 + 332
FEATURE_STEP = "features (1-value import, not counted)"


def caption_pool(files=CAPTION_FILES) -> tuple[list[list[str]], list[str]]:
    """Tokenized real captions (Karpathy's tokenization) from the COCO caption files that exist."""
    from rdpp_cli.data.karpathy import tokenize

    caps, used = [], []
    for p in filter(Path.is_file, files):
        caps += [t for t in (tokenize(a["caption"]) for a in json.loads(p.read_text())["annotations"]) if t]
        used.append(str(p))
    if not caps:
        raise SystemExit("no COCO caption file found (tests/data/coco-val2014-1k/captions_val2014_1k.json)")
    return caps, used


def resample_captions(pool: list[list[str]], n: int, seed: int = 0, max_len: int = 50) -> list[list[str]]:
    """``n`` captions drawn from a trigram chain over ``pool``: every trigram (with two start marks
    and an end mark) is one seen in a real caption, so word and n-gram frequencies follow the real
    ones while most captions are new (as COCO's 616k are, beyond any 30k of them)."""
    words = sorted({w for c in pool for w in c})
    wid = {w: i + 2 for i, w in enumerate(words)}  # 0: start, 1: end
    V = len(words) + 2
    tri = []
    for c in pool:
        ids = [0, 0] + [wid[w] for w in c] + [1]
        tri += [(ids[k] * V + ids[k + 1], ids[k + 2]) for k in range(len(ids) - 2)]
    tri_a = np.array(tri, dtype=np.int64)
    tri_a = tri_a[np.argsort(tri_a[:, 0], kind="stable")]
    keys, start = np.unique(tri_a[:, 0], return_index=True)
    end, nxt = np.append(start[1:], len(tri_a)), tri_a[:, 1]
    rng = np.random.default_rng(seed)
    a, b = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    out = np.ones((n, max_len), dtype=np.int64)  # 1 = ended
    alive = np.ones(n, dtype=bool)
    for t in range(max_len):
        k = np.searchsorted(keys, a * V + b)
        c = np.where(alive, nxt[start[k] + (rng.random(n) * (end[k] - start[k])).astype(np.int64)], 1)
        out[:, t], a, b = c, b, c
        alive &= c != 1
        if not alive.any():
            break
    inv = ["", ""] + words
    return [[inv[i] for i in row[:np.argmax(row == 1) if (row == 1).any() else max_len]] or [inv[int(nxt[start[0]])]]
            for row in out]


def karpathy_splits(images: int | None) -> dict[str, int]:
    """COCO's Karpathy split sizes, or ``images`` shared out in the same proportions."""
    total = sum(KARPATHY_SPLITS.values())
    if images is None or images >= total:
        return dict(KARPATHY_SPLITS)
    out = {k: max(1, v * images // total) for k, v in KARPATHY_SPLITS.items()}
    out["train"] += images - sum(out.values())
    return out


def write_karpathy_json(path: Path, seed: int = 0, images: int | None = None) -> dict:
    """COCO's Karpathy split file (at full size unless ``images``), captions resampled from real ones."""
    pool, used = caption_pool()
    splits = karpathy_splits(images)
    n_img = sum(splits.values())
    n_cap = 5 * n_img + min(EXTRA_CAPTION_IMAGES, n_img)
    caps = resample_captions(pool, n_cap, seed)
    images, k, cocoid = [], 0, 1
    for split, count in splits.items():
        folder = "val2014" if split in ("restval", "val", "test") else "train2014"
        for _ in range(count):
            m = 6 if len(images) < EXTRA_CAPTION_IMAGES else 5
            sents = [{"tokens": c, "raw": " ".join(c).capitalize() + ".", "imgid": len(images), "sentid": k + j}
                     for j, c in enumerate(caps[k:k + m])]
            images.append({"filepath": folder, "filename": f"COCO_{folder}_{cocoid:012d}.jpg", "imgid": len(images),
                           "split": split, "cocoid": cocoid, "sentids": [s["sentid"] for s in sents],
                           "sentences": sents})
            k, cocoid = k + m, cocoid + 1
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return {"images": n_img, "captions": n_cap, "pool_captions": len(pool), "pool_files": used,
            "json_mb": path.stat().st_size / 1e6}


def _timed(obj, name: str, label: str, phases: dict) -> None:
    """Wrap ``obj.name`` so that its wall time adds to ``phases[label]`` (skipped if absent)."""
    fn = getattr(obj, name, None)  # a classmethod comes bound to its class: set back as a staticmethod
    if fn is None:
        return

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[label] = phases.get(label, 0.0) + time.perf_counter() - t

    setattr(obj, name, staticmethod(wrapper) if isinstance(vars(obj).get(name), classmethod) else wrapper)


def text_child(json_path: Path, out: Path, feats: Path) -> None:
    """Runs in a child process: prepro_coco's text side, timed by step; prints one JSON line."""
    import rdpp_cli.data.prepro as P
    from rdpp_cli.data import vocab as V
    from rdpp_cli.metrics.cider import DocFreq

    phases: dict[str, float] = {}
    for obj, name, label in ((P, "load_karpathy", "read and check the JSON"), (V, "build_vocab", "vocabulary"),
                             (V, "encode_all", "labels (encode)"), (P, "_fill_captions", "captions.h5"),
                             (DocFreq, "from_references", "cider df: count"), (DocFreq, "fill_h5", "cider df: write"),
                             (P, "_write_features", FEATURE_STEP), (P, "write_manifest", "manifest (hashes)")):
        _timed(obj, name, label, phases)
    t = time.perf_counter()
    P.prepro_coco(json_path, out=out, features_from=feats, batch_size=4096, workers=0, force=True)
    wall = time.perf_counter() - t
    phases["other"] = wall - sum(phases.values())
    with h5py.File(out / "cider_df.h5") as f:
        n_df = int(f["df"].shape[0])
    vocab = len(json.loads((out / "vocab.json").read_text())["words"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps({"wall_s": wall, "peak_gb": peak / 1e9, "phases": phases, "vocab": vocab,
                                  "df_ngrams": n_df}))


def bench_text(args) -> dict:
    work, jpath = args.dir, args.dir / "dataset_coco.json"
    work.mkdir(parents=True, exist_ok=True)
    spec = reused(work / "text-spec.json", {"images": args.images}, 
                  lambda: write_karpathy_json(jpath, images=args.images))
    feats = work / "one_value_features.h5"
    ids = [im["cocoid"] for im in json.loads(jpath.read_text())["images"]]
    with h5py.File(feats, "w") as f:
        f["att"], f["image_ids"] = np.zeros((len(ids), 1, 1), dtype=np.float16), np.array(ids, dtype=np.int64)
    runs = []
    for r in range(args.repeats):
        p = subprocess.run([sys.executable, __file__, "text", "--_child", str(jpath), str(work / f"out-{r}"), str(feats)],
                           capture_output=True, text=True, env=NO_PROGRESS)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode or line is None:
            raise SystemExit(f"text prepro failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        runs.append(json.loads(line[len("RESULT "):]))
        runs[-1]["text_s"] = runs[-1]["wall_s"] - runs[-1]["phases"].get(FEATURE_STEP, 0.0)  # all but the stand-in
        shutil.rmtree(work / f"out-{r}", ignore_errors=True)
    mid = sorted(runs, key=lambda x: x["text_s"])[len(runs) // 2]
    return {**spec, "runs": [r["text_s"] for r in runs], "prepro_call_s": mid["wall_s"],
            "text_prepro_s": float(np.median([r["text_s"] for r in runs])),
            "text_prepro_peak_gb": max(r["peak_gb"] for r in runs),
            **{k: mid[k] for k in ("phases", "vocab", "df_ngrams")}}


def show_text(text: dict, args) -> None:
    print_table(f"text side of prepro coco: {text['images']:,} images, {text['captions']:,} captions (resampled from "
                f"{text['pool_captions']:,} real ones); vocab {text['vocab']:,}, {text['df_ngrams']:,} df n-grams",
                ["step", "s"], [[k, f"{v:.1f}"] for k, v in text["phases"].items()]
                + [["[bold]text side (median)[/bold]", f"[bold]{text['text_prepro_s']:.1f}[/bold]"],
                   ["peak RSS (GB, imports included)", f"{text['text_prepro_peak_gb']:.2f}"]])


# -- the command ---------------------------------------------------------------------------------------

BENCH = {"extract": (bench_extract, show_extract), "toy": (bench_toy, show_toy), "text": (bench_text, show_text)}


def parse_args(argv=None) -> argparse.Namespace:
    ap, shared, add = subcommands(__doc__)
    shared.add_argument("--repeats", type=int, default=3, help="timed runs of each side (median)")
    shared.add_argument("--threads", type=int, default=None, help="torch threads (toy: the children's OMP_NUM_THREADS)")
    p = add("extract", "feature extraction against prepro_feats.py's loop")
    p.add_argument("--root", type=Path, default=SHARED / "data" / "coco-real-390")
    p.add_argument("--weights", type=Path, default=SHARED / "weights" / "mobilenet_v2-imagenet-features.pth")
    p.add_argument("--images", type=int, default=48)
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--workers", default="0,1,default")
    p.add_argument("--batches", default="8,32")
    p = add("toy", "rdpp prepro toy, pixstats against a random resnet18")
    p.add_argument("--images", type=int, default=3000, help="images of the timed runs (the default set)")
    p.add_argument("--check-images", type=int, default=60, help="images of the untimed check run")
    p = add("text", "prepro coco's text side at COCO's size")
    p.set_defaults(repeats=1)
    p.add_argument("--images", type=int, default=None, help="images of the Karpathy file (default: COCO's 123,287)")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "rdpp-bench-data-text",
                   help="where the files go (default: under $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the files (a rerun reuses them)")
    p.add_argument("--_child", nargs=3, type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if getattr(args, "_child", None):
        return text_child(*args._child)
    bench, show = BENCH[args.what]
    run_bench(f"prepro_{args.what}", lambda: bench(args), show, args, args.dir if args.what == "text" else None)


if __name__ == "__main__":
    main()
