"""The data path at COCO's feature shape: the training loader, whole epochs, writing features.h5, the content check.

One subcommand each, on a synthetic artifact of ``--rows`` COCO-shaped images (0.81 MB an image;
``common.write_artifact``) in ``--dir`` (default: under $TMPDIR), deleted at the end unless
``--keep`` (a rerun with the same settings reuses it). Every path is checked to give the same
numbers first; passes interleaved, medians of ``--rounds``; *cold*: the files dropped from the page
cache before every pass. ``recipe`` projects the paper recipe's GPU-hours from the epochs' JSON
line. benchmarks/README.md ("the data path at COCO's scale", "data.py recipe") says what each does.

    python benchmarks/data.py loader|epochs|write|check|recipe [--json] ...   # each one's --help says its options
    python benchmarks/data.py epochs --device cpu --preset small --rows 300 --rl-epoch dpp          # the code path
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (ATT_DIM, BATCH, COCO_TRAIN_IMAGES, COCO_VAL_IMAGES, REGIONS, ROW_BYTES, feature_blocks,  # noqa: E402
                    feature_writer, recipe, write_artifact)
from timing import (cached_fraction, drop_cache, interleaved, machine, print_table, reused, run_bench,  # noqa: E402
                    subcommands)

COCO_IMAGES, BLOCK = 123_287, 32  # all of COCO's images; prepro coco's default batch


def built(work: Path, name: str, rows: int, npy: bool = False, **kw) -> tuple[Path, dict]:
    """``write_artifact(work / name, rows, **kw)`` (its ``.npy`` twins in ``work / f"{name}-npy"`` with
    ``npy=True``), reused when a kept run made it with the same settings."""
    art = work / name

    def make() -> dict:
        shutil.rmtree(art, ignore_errors=True)
        return write_artifact(art, rows, work / f"{name}-npy" if npy else None, **kw)

    return art, reused(work / f"{name}-spec.json", {"rows": rows, "npy": npy, **kw}, make)


# -- loader --------------------------------------------------------------------------------------------

def old_features(f: h5py.File, idx: np.ndarray):
    """rdpp 0.1.0's feature read (``DataArtifact.features`` at 787cd4c): h5py fancy indexing of
    the sorted unique rows, then float32 arrays."""
    import torch

    uniq, inverse = np.unique(idx, return_inverse=True)
    return tuple(torch.from_numpy(f[k][uniq][inverse].astype(np.float32)) for k in ("fc", "att"))


def old_captions(labels: h5py.Dataset, start: np.ndarray, end: np.ndarray, idx: np.ndarray, k: int,
                 rng: np.random.Generator) -> np.ndarray:
    """rdpp 0.1.0's ``DataArtifact.captions_per_image`` (at 787cd4c): one HDF5 read per image."""
    out = np.zeros((len(idx), k, labels.shape[1]), dtype=np.int64)
    for b, i in enumerate(idx):
        s, e = int(start[i]), int(end[i])
        rows = np.arange(s, e) if e - s == k else s + rng.choice(e - s, k, replace=e - s < k)
        block = labels[s:e]
        out[b] = block[np.sort(rows) - s] if e - s >= k else block[rows - s]
    return out


def timed_pass(batches) -> tuple[float, float]:
    """(seconds to the first batch, images/s from the first batch to the last) of a generator of batch sizes."""
    t0, sizes = time.perf_counter(), iter(batches)
    next(sizes)
    t_first = time.perf_counter()
    n_after_first = sum(sizes)  # each batch is made as it is asked for
    t_end = time.perf_counter()
    return t_first - t0, (n_after_first / (t_end - t_first) if t_end > t_first else float("nan"))


def loader_paths(data, art: Path, subset, old_batches: int, seed: int = 0) -> tuple[dict, dict]:
    """The passes to time (name -> pass(round) -> batch sizes) and the memory maps kept open: rdpp's
    loader per worker count (added by the caller), numpy memmap (kept mapped, and mapped per pass),
    rdpp 0.1.0's loader. The first batch is checked to be the same by every path (SystemExit if not)."""
    import torch

    from rdpp_cli.data.loader import CaptionBatches

    npy = art.parent / f"{art.name}-npy"
    open_maps = lambda: {k: np.load(npy / f"{k}.npy", mmap_mode="r") for k in ("att", "fc")}  # noqa: E731
    kept = open_maps()  # mapped once: pages touched in earlier passes stay mapped (warm only)
    old_h5, old_caps = h5py.File(art / "features.h5", "r"), h5py.File(art / "captions.h5", "r")
    batches = lambda r, **kw: CaptionBatches(data, images=subset, batch_size=BATCH, seed=seed + r, **kw)  # noqa: E731

    def memmap(r, maps=None):
        b = batches(r)
        order, m = b.permutation(0), maps if maps is not None else open_maps()
        for k in range(len(b)):
            idx = np.sort(b.global_batch(0, k, order))
            att, fc = np.take(m["att"], idx, axis=0), np.take(m["fc"], idx, axis=0)
            yield min(len(att), len(fc))
        del m  # unmapped (np.take made copies), so that the pages can leave the cache

    def old(r):
        b = batches(r)
        order = b.permutation(0)
        for k in range(old_batches):
            idx = b.global_batch(0, k, order)
            old_captions(old_caps["labels"], data.label_start, data.label_end, idx, 5, np.random.default_rng([seed + r, 0, k]))
            yield len(old_features(old_h5, idx)[1])

    b0 = next(batches(0).epoch(0))
    fc_old, att_old = old_features(old_h5, b0.index)
    labels_old = old_captions(old_caps["labels"], data.label_start, data.label_end, b0.index, 5,
                              np.random.default_rng([seed, 0, 0]))
    if not (np.array_equal(b0.att.numpy(), kept["att"][b0.index]) and np.array_equal(b0.fc.numpy(), kept["fc"][b0.index])
            and torch.equal(b0.att, att_old) and torch.equal(b0.fc, fc_old) and np.array_equal(b0.labels.numpy(), labels_old)):
        raise SystemExit("the loader, the memmap reference and the 787cd4c read disagree on the first batch")
    paths = {"memmap kept": lambda r: memmap(r, kept), "memmap": memmap, "loader 787cd4c": old,
             "_loader": lambda w, r: (x.size for x in batches(r, num_workers=w).epoch(0))}
    return paths, kept


def passes(cache: str, configs: dict, files: list[Path], rounds: int) -> dict:
    """``rounds`` interleaved passes of every configuration (cold: ``files`` dropped from the page
    cache before each): median images/s, GB/s and time to the first batch per configuration."""
    times: dict[str, list] = {k: [] for k in configs}
    resident, res = [], {}
    for r in range(rounds):
        for name, make in configs.items():
            if cache == "cold":
                res["cold_method"] = drop_cache(files)
                resident.append(cached_fraction(files[0]))
            times[name].append(timed_pass(make(r)))
    for name, ts in times.items():
        ips = float(np.median([t[1] for t in ts]))
        res[f"{cache} {name}"] = {"images_per_s": ips, "gb_per_s": ips * ROW_BYTES / 1e9,
                                  "first_batch_s": float(np.median([t[0] for t in ts])), "passes": [t[1] for t in ts]}
    if cache == "cold":
        res["cold_resident_features_h5"] = [x for x in resident if x is not None] or None
    return res


def bench_loader(work: Path, args) -> dict:
    """Passes over ``--images`` of the artifact's rows, warm then cold, and ``bench_bounds``."""
    from rdpp_cli.data.dataset import DataArtifact

    art, spec = built(work, "loader-data", args.rows, npy=True)
    data = DataArtifact.open(art)
    subset = np.sort(np.random.default_rng(0).permutation(len(data.image_ids))[:min(args.images, len(data.image_ids))])
    paths, kept = loader_paths(data, art, subset, max(2, args.old_batches))  # images/s from the first batch on
    loader = paths.pop("_loader")
    configs = {**{f"loader w{w}": (lambda r, w=w: loader(w, r)) for w in args.workers}, **paths}
    files = [art / "features.h5", *(art.parent / f"{art.name}-npy" / f"{k}.npy" for k in ("att", "fc"))]
    res: dict = {"images_per_pass": len(subset), "layout": spec["layout"], "build_s": spec["build_s"]}
    timed_pass(loader(0, 0)), timed_pass(paths["memmap kept"](0))  # warm: the subset cached through both files
    res.update(passes("warm", configs, files, args.rounds))
    configs.pop("memmap kept")  # mapped pages cannot be dropped from the cache: no kept mapping when cold
    kept.clear()
    res.update(passes("cold", configs, files, args.rounds))
    data.close()
    res["bounds"] = bench_bounds(art)
    return res


def bench_bounds(art: Path, batches: int = 20, rounds: int = 3, seed: int = 1) -> dict:
    """What one warm batch's 50 att rows cost by each way of reading them (ms per batch, median of
    interleaved rounds over the same cached rows): where the loader's time goes."""
    import torch

    from rdpp_cli.data.dataset import DataArtifact

    data = DataArtifact.open(art)
    data.feature_rows([0])
    reader = data._readers["att"]
    rng = np.random.default_rng(seed)
    sets = [np.sort(rng.choice(len(data.image_ids), BATCH, replace=False)) for _ in range(batches)]
    reused = np.empty((BATCH, REGIONS, ATT_DIM), np.float16)
    f = h5py.File(art / "features.h5", "r")

    def shared(idx):  # what a DataLoader worker process must do before handing a batch over
        t = torch.empty(0, dtype=torch.float16).set_(torch.UntypedStorage._new_shared(reused.nbytes), 0, reused.shape)
        reader.read(idx, None, t.numpy())

    ways = {"preadv into a reused buffer": lambda idx: reader.read(idx, None, reused),
            "preadv into new memory (the loader on CPU)": lambda idx: reader.read(idx, None),
            "preadv into new shared memory (a worker process)": shared,
            "h5py, one row at a time": lambda idx: [f["att"][int(i)] for i in idx],
            "h5py fancy indexing (787cd4c)": lambda idx: f["att"][idx]}
    for idx in sets:  # cached
        reader.read(idx, None, reused)
    def per_batch(fn, todo):  # h5py's ways on 2 batches only: they are slow
        return lambda: [fn(idx) for idx in todo] and len(todo)

    t = interleaved({name: per_batch(fn, sets if "h5py" not in name else sets[:2]) for name, fn in ways.items()}, rounds)
    f.close(), data.close()
    return {k: {"ms_per_batch": 1e3 * v.median / v.results[-1], "images_per_s": BATCH * v.results[-1] / v.median}
            for k, v in t.items()}


def show_loader(res: dict, args) -> None:
    kept_ref, pass_ref = res["warm memmap kept"]["images_per_s"], res["warm memmap"]["images_per_s"]
    labels = {"loader 787cd4c": "rdpp loader at 787cd4c", "memmap kept": "numpy memmap .npy, mapping kept (reference)",
              "memmap": "numpy memmap .npy, mapped per pass (reference)"}
    rows = []
    for name in [f"loader w{w}" for w in args.workers] + ["loader 787cd4c", "memmap kept", "memmap"]:
        wm, cd = res[f"warm {name}"], res.get(f"cold {name}")
        wk = name[len("loader w"):] if name.startswith("loader w") else "0" if "787" in name else "-"
        rows.append([labels.get(name, "rdpp loader"), wk, f"{wm['images_per_s']:,.0f}", f"{wm['gb_per_s']:.2f}",
                     f"{cd['images_per_s']:,.0f}" if cd else "n/a", f"{cd['gb_per_s']:.2f}" if cd else "n/a",
                     f"{wm['images_per_s'] / kept_ref:.2f}×", f"{wm['images_per_s'] / pass_ref:.2f}×",
                     f"{wm['first_batch_s']:.2f}"])
    print_table(f"loader: batches of {BATCH} of {args.rows:,} COCO-shaped rows (0.81 MB fp16 each), shuffled; "
                f"features.h5 att chunks {res['layout']['att']['chunks']}; median of {args.rounds} interleaved passes "
                f"of {res['images_per_pass']:,} images (787cd4c: {max(2, args.old_batches)} batches); cold by "
                f"{res.get('cold_method')}", ["path", "workers", "warm images/s", "warm GB/s", "cold images/s",
                                              "cold GB/s", "vs memmap kept (warm)", "vs memmap per pass (warm)",
                                              "first batch s (warm)"], rows)
    print_table("where a warm batch's time goes: 50 att rows (40 MB), read by each way", ["way", "ms per batch", "images/s"],
                [[k, f"{v['ms_per_batch']:.1f}", f"{v['images_per_s']:,.0f}"] for k, v in res["bounds"].items()])


# -- epochs --------------------------------------------------------------------------------------------

def parse_configs(spec: str, preset_batch: int = 0) -> list[tuple[int, str, bool]]:
    """``128:fp32,128:fp32:ss`` -> [(128, "fp32", False), (128, "fp32", True)]: XE epochs' batch size,
    precision and whether scheduled sampling runs (at the schedule's largest probability); the batch
    ``preset`` is the preset's (``preset_batch``)."""
    out = []
    for item in filter(None, spec.split(",")):
        b, prec, *ss = item.split(":")
        b = str(preset_batch) if b == "preset" and preset_batch else b
        if not b.isdigit() or prec not in ("fp32", "bf16", "fp16") or ss not in ([], ["ss"]):
            raise SystemExit(f"--xe-configs {spec}: give BATCH:PRECISION[:ss] items (BATCH a number or preset), "
                             "e.g. 128:fp32,128:fp32:ss")
        out.append((int(b), prec, bool(ss)))
    return out


def xe_options(ss: bool, **kw):
    """train-xe's options; ``ss``: scheduled sampling from the first epoch at ``ss_max`` (the preset
    starts it at epoch 0 with probability 0 that grows every 5 epochs: 25 of its 30 epochs run it)."""
    from rdpp_cli.training.options import XEOptions

    class EverySS(XEOptions):
        def ss_prob(self, epoch: int) -> float:
            return self.ss_max

    return EverySS(**kw, ss_start=0) if ss else XEOptions(**kw)


def epoch_row(out: Path, wall: float, train_rows: int) -> dict:
    """The run's metrics.csv row: images/s of the training steps, the epoch's seconds (validation and
    saving included) and what validation and saving took beyond the steps."""
    import csv

    with open(out / "metrics.csv") as f:
        row = list(csv.DictReader(f))[-1]
    ips, t = float(row["images_per_s"]), float(row["time"])
    return {"images_per_s": ips, "epoch_s": t, "val_s": max(t - train_rows / ips, 0.0), "call_s": wall}


def bench_epochs(work: Path, args) -> dict:
    """Whole epochs through ``train_xe`` (each ``--xe-configs``) and, from the first XE run's model,
    through ``finetune`` (each ``--rl-epoch`` reward at ``--m``, the paper preset's batch), for each
    worker count and cache state; untimed epochs over 256 images first."""
    import torch

    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    rl, val, rows = [r for r in args.rl_epoch.split(",") if r], args.val, args.rows
    res: dict = {"rows": rows, "val": val, "device": args.device, "preset": args.preset, "epochs": []}
    art, made = built(work, "xe-data", rows, real_df=bool(rl), val=val)
    res.update({k: made[k] for k in ("features_gb", "layout", "build_s")})
    if args.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name()
    small, _ = built(work, "warmup-data", 256, real_df=bool(rl), val=min(val, 32))
    rl_batch = recipe("att2in", "finetune", "paper")["batch_size"]
    for d in (art, small):  # a kept run's models are not reused
        shutil.rmtree(work / f"init-{d.name}", ignore_errors=True)
    for cache, w in [("untimed", 0)] + [(c, w) for c in args.caches.split(",") if c for w in args.workers]:
        data, n_val = (small, min(val, 32)) if cache == "untimed" else (art, val)
        init = work / f"init-{data.name}"  # the model the RL epochs start from: the first XE epoch's on data
        run = dict(data=data, val_images=n_val, device=args.device, workers=w, force=True, resume=False)

        def epoch(stage: str, train, **kw):
            if cache == "cold":
                res["cold_method"] = drop_cache([art / "features.h5"])
            out = init if stage == "xe" and not init.exists() else work / f"run-{stage}"
            t = time.perf_counter()
            train(out)
            if cache == "untimed":  # the warm-up: compiling (the fast path), caches; reported apart
                res.setdefault("warmup", []).append({"stage": stage, **kw, "s": time.perf_counter() - t})
            else:
                res["epochs"].append({"stage": stage, **kw, "cache": cache, "workers": w,
                                      **epoch_row(out, time.perf_counter() - t, rows - val)})
            show_progress(res, args, (res["warmup"] if cache == "untimed" else res["epochs"])[-1])
            if out != init:
                shutil.rmtree(out, ignore_errors=True)

        for batch, prec, ss in parse_configs(args.xe_configs, recipe("att2in", "xe", args.preset)["batch_size"]):
            epoch("xe", lambda out: train_xe(xe_options(ss, out=out, preset=args.preset, epochs=1, batch_size=batch,
                                                        precision=prec, **run)),
                  batch=batch, precision=prec, ss="ss" if ss else "")
        for reward in rl:
            epoch(reward, lambda out: finetune(init, reward=reward, m=args.m, preset="paper", epochs=1, out=out, **run),
                  m=args.m, batch=rl_batch, precision="fp32")
    return res


def show_progress(res: dict, args, e: dict) -> None:
    """The epoch (or warm-up) ``e`` just run, printed at once, and with ``--json`` every result so far as
    the JSON line ``data.py recipe`` reads: a run stopped at its time limit still reports what it measured."""
    if "cache" not in e:
        print(warmup_line(e), flush=True)
    else:
        print(f"epoch {_what(e)}, {e['cache']} cache, {e['workers']} workers: {e['images_per_s']:,.0f} images/s, "
              f"{e['epoch_s']:.1f} s (validation {e['val_s']:.1f} s)", flush=True)
    if args.json:
        print(json.dumps({"benchmark": "data_epochs", "partial": True, "xe_epoch": res}), flush=True)


def show_epochs(res: dict, args) -> None:
    rows = [[(e["stage"] + (" ss" if e.get("ss") else "")) if e["stage"] == "xe" else f"{e['stage']} m={e['m']}",
             e["batch"], e["precision"], e["cache"], e["workers"], f"{e['images_per_s']:,.0f}", f"{e['epoch_s']:.1f}",
             f"{e['val_s']:.1f}", f"{COCO_TRAIN_IMAGES / e['images_per_s']:,.0f}"] for e in res["epochs"]]
    print_table(f"whole epochs, {args.preset} preset, {args.rows:,} images of 196×2,048 fp16 "
                f"({res.get('gpu', args.device)}; data loading included)",
                ["stage", "batch", "precision", "cache", "workers", "images/s", "epoch s", "val s",
                 "a COCO epoch (113,287 images) s"], rows)
    for e in res.get("warmup", []):
        print(warmup_line(e))


def _what(e: dict) -> str:
    return e["stage"] + (" ss" if e.get("ss") else "") + f" batch {e['batch']} {e['precision']}"


def warmup_line(e: dict) -> str:
    """An untimed warm-up's line (its seconds: compiling, caches)."""
    return f"warm-up (untimed; compiling included) {_what(e)}: {e['s']:.1f} s"


# -- write ---------------------------------------------------------------------------------------------

def writers():
    """rdpp's FeatureWriter, the same without the fsync, and with the digests from memory (no read-back, no fsync)."""
    from rdpp_cli.artifacts import content_hash
    from rdpp_cli.data.features import FeatureWriter

    class NoSync(FeatureWriter):
        def _sync(self):
            self.f.flush()

    class FromMemory(NoSync):
        def _read_back(self, s, k, arrays):
            return content_hash.block_digest(arrays)

    return {"read back": FeatureWriter, "no fsync": NoSync, "from memory": FromMemory}


def bench_write(work: Path, args) -> dict:
    """The three writers interleaved, checked to give the manifest's hash; then the resume check, warm and cold."""
    from rdpp_cli.artifacts import content_hash

    rows, blocks, ways = args.rows, list(feature_blocks(args.rows, BLOCK)), writers()

    def write(cls, path):
        path.unlink(missing_ok=True)
        w = feature_writer(path, rows, BLOCK, cls)
        for _, fc, att in blocks:
            w.write(fc, att)
        return w.finish()["sha256"]

    t = interleaved({name: (lambda cls=cls, p=work / f"{k}.h5": write(cls, p)) for k, (name, cls) in enumerate(ways.items())},
                    args.rounds)
    f = work / "0.h5"
    hashes = {v.results[-1] for v in t.values()}
    assert hashes == {content_hash.recompute(f, f"h5rows:fc,att,image_ids;block={BLOCK}")}, hashes
    with h5py.File(f, "r+") as h:
        h.attrs["_done"] = rows  # finished rows, no manifest yet: what a rerun after a failed manifest opens
    def reopen():  # a rerun opening the finished file: every block read back and its digest compared
        w = feature_writer(f, rows, BLOCK)
        assert w.done == rows
        w.close()

    r = interleaved({"warm": reopen, "cold": reopen}, args.rounds, before=lambda c: c == "cold" and drop_cache([f]))
    out = {**{name: v.median for name, v in t.items()}, **{f"resume check {c}": v.median for c, v in r.items()}}
    return {"rows": rows, "bytes": f.stat().st_size, "seconds": out, "machine": machine()}


def show_write(res: dict, args) -> None:
    scale, sec, gb = COCO_IMAGES / res["rows"], res["seconds"], res["bytes"] / 1e9
    labels = {"from memory": "written, digests from memory (baseline)", "no fsync": "written, read back",
              "read back": "written, read back, fsync at the end (rdpp)",
              "resume check warm": "resume check, warm", "resume check cold": "resume check, cold"}
    rows = [[label, f"{sec[k]:.2f}", f"{gb / sec[k]:.2f}", f"{sec[k] * scale:,.0f}"] for k, label in labels.items()]
    extra = sec["no fsync"] - sec["from memory"]
    rows.append(["reading back: the difference", f"{extra:+.2f}", "-", f"{extra * scale:+,.0f}"])
    # the fsync waits for what the disk has not taken yet: the whole file here, the last few GB of a
    # long extraction (the kernel writes dirty pages out as they come), so it is not scaled
    rows.append(["the fsync at the end: the difference", f"{sec['read back'] - sec['no fsync']:+.2f}", "-", "-"])
    print_table(f"features.h5 of {res['rows']:,} COCO-shaped images ({gb:.2f} GB), projected to {COCO_IMAGES:,} "
                f"images by bytes; {res['machine']}", ["way", "s here", "GB/s", "s at COCO"], rows)


# -- check ---------------------------------------------------------------------------------------------

def h5py_row_blocks(path: Path, hash_of: str) -> str:
    """The row-block hash read through h5py, one block after another (content_hash's slow path)."""
    from rdpp_cli.artifacts import content_hash

    names, block = content_hash.parse(hash_of)
    with h5py.File(path, "r") as f:
        n = f[names[0]].shape[0]
        return content_hash.combine([content_hash.block_digest([f[d][s:s + block] for d in names])
                                     for s in range(0, n, block)])


def bench_check(work: Path, args, cached_calls: int = 200) -> dict:
    """First check, h5py's blocks and sha256 of the file, interleaved warm and cold; the cached check."""
    from rdpp_cli.artifacts import content_hash, read_artifact, sha256_file, verified

    art_dir, _ = built(work, "check-data", args.rows, block=BLOCK)
    art = read_artifact(art_dir, "rdpp.data")
    f, entry = art_dir / "features.h5", art.manifest["files"]["features.h5"]
    if args.check_threads:
        os.environ["RDPP_HASH_THREADS"] = str(args.check_threads)

    def first() -> str:  # Artifact.file with nothing remembered (a copied workspace): every row block hashed again
        (art_dir / verified.VERIFIED).unlink(missing_ok=True)
        verified._SEEN.clear()
        art.file("features.h5")
        return entry["sha256"]

    ways = {"first": first, "h5py": lambda: h5py_row_blocks(f, entry["hash_of"]), "sha256 file": lambda: sha256_file(f)}
    assert ways["h5py"]() == entry["sha256"] and first() == entry["sha256"]
    cold: dict = {}
    t = interleaved({f"{c} {w}": fn for c in ("warm", "cold") for w, fn in ways.items()}, args.rounds,
                    before=lambda name: name.startswith("cold") and cold.update(method=drop_cache([f])))
    cached = interleaved({"cached": lambda: art.file("features.h5")}, args.rounds * cached_calls,
                         before=lambda _: verified._SEEN.clear())["cached"]  # a new process: stat + the hashes' JSON
    size = f.stat().st_size
    res = {k: {"s": v.median, "gb_per_s": size / v.median / 1e9} for k, v in t.items()}
    res["cached"] = {"s": cached.median}
    return {"rows": args.rows, "bytes": size, "threads": content_hash.default_threads(), "cold_method": cold.get("method"),
            "ways": res}


def show_check(res: dict, args) -> None:
    cpu_epoch, gpu_epoch = -(-COCO_TRAIN_IMAGES // BATCH) * args.cpu_step_s, args.gpu_epoch_s
    scale, ways = COCO_IMAGES / res["rows"], res["ways"]
    labels = {"first": f"first check: Artifact.file, row blocks by pread on {res['threads']} threads",
              "h5py": "row blocks through h5py, one after another (other layouts)",
              "sha256 file": "sha256 of the file's bytes, 1 thread (reference)"}
    rows = []
    for k in labels:
        for cache in ("warm", "cold"):
            v = ways[f"{cache} {k}"]
            coco = v["s"] * scale
            rows.append([labels[k], cache, f"{v['gb_per_s']:.2f}", f"{v['s']:.2f}", f"{coco:,.0f}",
                         f"{100 * coco / cpu_epoch:.2f}", f"{100 * coco / gpu_epoch:.1f}"])
    c = ways["cached"]["s"]
    rows.append(["cached check: Artifact.file, hash remembered", "-", "-", f"{c * 1e3:.3f} ms", f"{c * 1e3:.3f} ms",
                 f"{100 * c / cpu_epoch:.5f}", f"{100 * c / gpu_epoch:.4f}"])
    print_table(f"content check of features.h5: {res['rows']:,} COCO-shaped images ({res['bytes'] / 1e9:.2f} GB), "
                f"projected to {COCO_IMAGES:,} images; XE epoch {cpu_epoch:,.0f} s on a CPU ({args.cpu_step_s} s/step), "
                f"{gpu_epoch:g} s on a GPU; cold by {res['cold_method']}",
                ["way", "cache", "GB/s", "s here", "s at COCO", "% CPU epoch", "% GPU epoch"], rows)


# -- recipe: the paper recipe's GPU-hours from the epochs' JSON line ---------------------------------

def epoch_seconds(images_per_s: float, images: int = COCO_TRAIN_IMAGES) -> float:
    return images / images_per_s


def settings(epochs: list[dict]) -> dict[tuple, dict]:
    """{(stage, batch, precision, ss): {"images_per_s", "val_s"}} from `data.py epochs`'s rows: the slower
    cache state of each worker count, then the fastest worker count."""
    worst: dict[tuple, dict] = {}
    for e in epochs:
        key = (e["stage"], e["batch"], e["precision"], e.get("ss", ""), e["workers"])
        if key not in worst or e["images_per_s"] < worst[key]["images_per_s"]:
            worst[key] = {"images_per_s": e["images_per_s"], "val_s": e.get("val_s", 0.0)}
    best: dict[tuple, dict] = {}
    for key, r in worst.items():
        if key[:4] not in best or r["images_per_s"] > best[key[:4]]["images_per_s"]:
            best[key[:4]] = r
    return best


def coco_epoch(r: dict, val: int) -> float:
    """A COCO epoch's seconds at rate ``r``: its training images, and its validation scaled to 5,000 images."""
    return epoch_seconds(r["images_per_s"]) + (r["val_s"] * COCO_VAL_IMAGES / val if val else 0.0)


def recipe_hours(xe: float, xe_ss: float, rl: float, xe_epochs: int = 30, ss_epochs: int = 25,
                 rl_epochs: int = 100) -> float:
    """GPU-hours of the recipe from its epochs' seconds: plain XE, XE with scheduled sampling, RL."""
    return ((xe_epochs - ss_epochs) * xe + ss_epochs * xe_ss + rl_epochs * rl) / 3600


def recipes(rates: dict[tuple, dict], xe: dict, rl: dict, val: int) -> list[dict]:
    """The recipe with each measured RL reward, XE at the preset's batch (``xe``, ``rl``: common.recipe)."""
    plain = rates.get(("xe", xe["batch_size"], "fp32", ""))
    ss = rates.get(("xe", xe["batch_size"], "fp32", "ss"))
    out = []
    for reward, name in (("dpp", "R-DPP"), ("scst", "SCST")):
        r = rates.get((reward, rl["batch_size"], "fp32", ""))
        if plain is None or r is None:
            continue
        x, xs, y = coco_epoch(plain, val), coco_epoch(ss or plain, val), coco_epoch(r, val)
        out.append({"recipe": f"XE batch {xe['batch_size']} fp32, {xe['epochs'] - xe['ss_epochs']} epochs plain + "
                              f"{xe['ss_epochs']} with scheduled sampling{'' if ss else ' (not measured: plain rate)'}, "
                              f"then {rl['epochs']} {name} m=5 epochs (batch {rl['batch_size']} fp32)"
                              + (f", validating {COCO_VAL_IMAGES:,} images per epoch" if val else ", no validation"),
                    "xe_epoch_s": x, "xe_ss_epoch_s": xs, "rl_epoch_s": y,
                    "gpu_hours": recipe_hours(x, xs, y, xe["epochs"], xe["ss_epochs"], rl["epochs"])})
    return out


def show_recipe(args) -> None:
    """The measured epochs as COCO epochs, then each recipe's hours (the epochs' JSON line in ``args.results``)."""
    text = sys.stdin.read() if args.results == "-" else open(args.results).read()
    lines = [ln for ln in text.splitlines() if ln.startswith('{"benchmark": "data_epochs"')]
    if not lines:
        raise SystemExit(f"{args.results}: no line of `benchmarks/data.py epochs ... --json` in it")
    res = json.loads(lines[-1])["xe_epoch"]
    rates, where, val = settings(res["epochs"]), res.get("gpu") or res["device"], res.get("val", 0)
    print(f"Measured epochs ({res['rows']:,} COCO-shaped images, {val} validated, {res['preset']} preset, {where}), "
          f"as a COCO epoch of {COCO_TRAIN_IMAGES:,} images (+ validation of {COCO_VAL_IMAGES:,}):")
    for (stage, batch, prec, ss), r in sorted(rates.items()):
        print(f"  {stage + (' ss' if ss else ''):<8}{batch:>6}{prec:>6}{r['images_per_s']:>8,.0f} images/s"
              f"{coco_epoch(r, val):>8,.0f} s")
    rows = recipes(rates, recipe("att2in", "xe", res["preset"]), recipe("att2in", "finetune"), val)  # RL: always paper
    for r in rows:
        print(f"  {r['recipe']}: {r['gpu_hours']:.2f} {'GPU-hours' if res.get('gpu') else 'hours on the ' + res['device']}")
    if not rows:
        print("  (needs an XE epoch at the preset's batch and an RL epoch: data.py epochs --rl-epoch dpp)")
    if args.json:
        print(json.dumps({"benchmark": "recipe_hours", "device": where, "recipes": rows,
                          "rates": {"/".join(map(str, k)): v for k, v in rates.items()}}))


# -- the command ---------------------------------------------------------------------------------------

# each subcommand: measure, show, the key of its JSON line's result (`data.py recipe` reads "xe_epoch")
BENCH = {"loader": (bench_loader, show_loader, "loader"), "epochs": (bench_epochs, show_epochs, "xe_epoch"),
         "write": (bench_write, show_write, "write"), "check": (bench_check, show_check, "content_check")}


def parse_args(argv=None) -> argparse.Namespace:
    ap, shared, add = subcommands(__doc__)
    shared.add_argument("--rows", type=int, default=10_000, help="images in the synthetic features.h5 (0.81 MB each)")
    shared.add_argument("--dir", type=Path, default=None, help="where the big files go (default: under $TMPDIR)")
    shared.add_argument("--keep", action="store_true", help="keep the files (a rerun with the same settings reuses them)")
    shared.add_argument("--rounds", type=int, default=3, help="interleaved passes of each way (median)")
    shared.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    shared.add_argument("--workers", default="0,1,2", help="DataLoader worker counts, comma-separated")
    p = add("loader", "the training loader, warm and cold")
    p.add_argument("--images", type=int, default=2_500, help="images per timed pass (50 a batch)")
    p.add_argument("--old-batches", type=int, default=4, help="batches per pass of rdpp 0.1.0's loader (≥ 2)")
    p = add("epochs", "whole train-xe / finetune epochs (a GPU)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="paper", help="the XE epochs' model (small: a CPU check of the code path)")
    b = recipe("att2in", "xe", "paper")["batch_size"]
    p.add_argument("--xe-configs", default=f"{b}:fp32,{b}:fp32:ss", help="BATCH:PRECISION[:ss],... (ss: scheduled sampling; BATCH preset: the preset's)")
    p.add_argument("--val", type=int, default=0, help="rows in the val split, validated after every epoch")
    p.add_argument("--caches", default="warm,cold", help="warm, cold or both")
    p.add_argument("--rl-epoch", default="", help="also RL epochs of these rewards (dpp,scst) from the first XE epoch's model")
    p.add_argument("--m", type=int, default=5, help="samples per image of --rl-epoch")
    add("write", "writing features.h5 and the resume check").set_defaults(rows=1000)
    p = add("check", "the content check on read of features.h5")
    p.add_argument("--check-threads", type=int, default=None, help="hashing threads (default: rdpp's)")
    p.add_argument("--cpu-step-s", type=float, default=2.4, help="CPU XE seconds per 50-image step")
    p.add_argument("--gpu-epoch-s", type=float, default=80.0, help="GPU XE epoch seconds")
    p = add("recipe", "the paper recipe's GPU-hours from the epochs' JSON line (arithmetic only)", shared=False)
    p.add_argument("results", help="a file holding `data.py epochs --json`'s output, or - for stdin")
    args = ap.parse_args(argv)
    if args.what != "recipe":
        args.workers = [int(w) for w in args.workers.split(",") if w != ""]
    return args


def main(argv=None) -> None:
    import torch

    args = parse_args(argv)
    if args.what == "recipe":
        return show_recipe(args)
    torch.set_num_threads(args.threads)
    bench, show, key = BENCH[args.what]
    work = args.dir or Path(tempfile.gettempdir()) / f"rdpp-bench-data-{args.what}"
    work.mkdir(parents=True, exist_ok=True)
    run_bench(f"data_{args.what}", lambda: bench(work, args), show, args, work, key, rows=args.rows)


if __name__ == "__main__":
    main()
