"""Time of `rdpp compare` at COCO's test scale: 5,000 images x 4 models x 20 captions (docs/compare.md).

Builds (untimed, kept in ``--root``) a synthetic workspace: 5,000 test images with 5 references and a
640x480 JPEG each (and 5,000 training images for the df), four samples artifacts of 20 captions per
image from a Zipf 2,000-word vocabulary at four temperatures; then runs ``rdpp compare`` of the four
in a fresh child process (imports, tokenizer, CIDEr-D, self-CIDEr, thumbnails, the page), ``--repeat``
times. No tool makes such a page, so there is no reference and no ratio.

    python benchmarks/compare.py [--images 5000] [--models 4] [--n 20] [--repeat 3] [--root DIR]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, machine, parser, reused  # noqa: E402

from rdpp_cli.artifacts import finish, prepare_output, write_manifest  # noqa: E402

WORDS = 2000


def _sentence(rng: np.random.Generator, words: list[str], p: np.ndarray, temp: float) -> str:
    q = p ** (1 / temp)
    q /= q.sum()
    return " ".join(words[j] for j in rng.choice(len(words), size=int(rng.integers(7, 13)), p=q))


def _photos(root: Path, ids: list[int], rng: np.random.Generator) -> None:
    from PIL import Image

    (root / "images").mkdir(parents=True, exist_ok=True)
    for i in ids:
        path = root / "images" / f"{i:012d}.jpg"
        if not path.is_file():
            base = rng.integers(0, 255, size=(1, 1, 3))
            grad = np.linspace(0, 1, 640)[None, :, None] * rng.integers(0, 255, size=(1, 1, 3))
            noise = rng.integers(0, 40, size=(480, 640, 1))
            Image.fromarray(np.clip(base * 0.5 + grad * 0.5 + noise, 0, 255).astype(np.uint8)).save(path, quality=85)


def _data(ws: Path, root: Path, images: int, rng: np.random.Generator):
    """The data artifact ``ws/data/synthetic-v1``: captions.h5, features.h5 (1-dim), cider_df.h5, and
    a Karpathy JSON with the photos outside it, as `rdpp prepro coco` records them."""
    words = [f"w{k}" for k in range(WORDS)]
    p = 1.0 / np.arange(1, WORDS + 1)
    n = 2 * images
    ids = list(range(1, n + 1))
    split = ["train"] * images + ["test"] * images
    refs = [[_sentence(rng, words, p, 1.0) for _ in range(5)] for _ in ids]
    _photos(root, ids[images:], rng)
    json.dump({"images": [{"cocoid": i, "filepath": "images", "filename": f"{i:012d}.jpg", "split": s}
                          for i, s in zip(ids, split)]}, open(root / "dataset.json", "w"))
    out = prepare_output(None, workspace=ws, group="data", name="synthetic", kind="rdpp.data", config={})
    (out / "vocab.json").write_text(json.dumps({"words": words}))
    with h5py.File(out / "captions.h5", "w") as f:
        f["labels"] = np.ones((5 * n, 16), dtype=np.int32)
        f["lengths"] = np.full(5 * n, 10, dtype=np.int32)
        f["label_start"] = np.arange(n, dtype=np.int64) * 5
        f["label_end"] = np.arange(1, n + 1, dtype=np.int64) * 5
        f["image_ids"] = np.array(ids, dtype=np.int64)
        f["split"] = np.array([s.encode() for s in split], dtype="S5")
        f.create_dataset("raw", data=np.array([r for rs in refs for r in rs], dtype=object), dtype=h5py.string_dtype())
    with h5py.File(out / "features.h5", "w") as f:
        f["fc"] = np.zeros((n, 1), np.float16)
        f["att"] = np.zeros((n, 1, 1), np.float16)
        f["image_ids"] = np.array(ids, dtype=np.int64)
    with h5py.File(out / "cider_df.h5", "w") as f:  # unigrams only: enough for the timing
        f["ngrams"] = np.array([[k, 0, 0, 0] for k in range(1, WORDS + 1)], dtype=np.int32)
        f["df"] = np.full(WORDS, 10.0)
        f.attrs["num_docs"] = images
        f.attrs["eos_id"] = WORDS + 1
    cfg = {"source": "coco", "karpathy_json": str(root / "dataset.json"), "images_root": str(root)}
    art = write_manifest(out, "rdpp.data", cfg)
    finish(out)
    return art, words, p, ids[images:]


def build(ws: Path, images: int, models: int, n: int) -> list[Path]:
    rng = np.random.default_rng(0)
    data, words, p, test = _data(ws, ws.parent / "photos", images, rng)
    out = []
    for m in range(models):
        temp = 0.3 + 0.5 * m
        cfg = {"split": "test", "method": "random", "n": n, "temperature": temp}
        path = prepare_output(None, workspace=ws, group="samples", name=f"model{m}", kind="rdpp.samples", config=cfg)
        recs = [{"image_id": i, "captions": [_sentence(rng, words, p, temp) for _ in range(n)]} for i in test]
        (path / "samples.json").write_text(json.dumps(recs))
        write_manifest(path, "rdpp.samples", cfg, inputs=[data])
        finish(path)
        out.append(path)
    return out


def main() -> None:
    ap = parser(__doc__, json=False)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--models", type=int, default=4)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", type=Path, default=Path("/tmp/rdpp-bench-compare"))
    args = ap.parse_args()
    ws = args.root / f"ws-{args.images}-{args.models}-{args.n}"

    def make() -> dict:  # untimed, kept in --root for the next run
        shutil.rmtree(ws, ignore_errors=True)
        return {"samples": [str(p) for p in build(ws, args.images, args.models, args.n)]}

    samples = reused(args.root / f"{ws.name}.json", {}, make)["samples"]
    env = {**os.environ, "RDPP_NO_PROGRESS": "1"}
    page = ws / "compare" / "bench"
    t = interleaved({"compare": lambda: subprocess.run(
        [sys.executable, "-m", "rdpp_cli", "compare", *samples, "--workspace", str(ws), "--out", str(page),
         "--force"], check=True, env=env, stdout=subprocess.DEVNULL)}, args.repeat)["compare"]
    size = sum(f.stat().st_size for f in page.rglob("*") if f.is_file())
    print(f"rdpp compare, {args.images:,} images x {args.models} models x {args.n} captions: median "
          f"{t.median:.1f} s (best {t.best:.1f} s, runs {', '.join(f'{x:.1f}' for x in t.times)}) on {machine()}; page folder "
          f"{size / 1e6:.1f} MB, index.html {(page / 'index.html').stat().st_size / 1e6:.2f} MB, "
          f"{len(list((page / 'data').iterdir()))} data files")


if __name__ == "__main__":
    main()
