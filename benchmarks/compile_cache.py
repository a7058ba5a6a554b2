"""Compiling paid once: a stage's compile seconds on its first run and on a second run of the same
shapes in a new process, which loads the compiled code from rdpp's inductor cache.

    python benchmarks/compile_cache.py [--device cpu|cuda] [--preset small] [--images 60] [--json]

In a fresh folder: `rdpp prepro toy`, then `rdpp train-xe --fast on` twice and `rdpp finetune
--reward dpp --fast on` from the first XE model twice, every run a separate process with the same
arguments (another --out), `XDG_CACHE_HOME` pointing into the folder so that the first run starts
from an empty cache. The figures are each run's `summary.compile_s` (torch's own compile timers) and
its whole wall time. No reference: this measures rdpp against itself (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rdpp(env: dict, *args: str) -> float:
    """Run ``rdpp ARGS`` in a new process; its wall seconds (a failure stops the script with its output)."""
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "rdpp_cli", *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"rdpp {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return time.perf_counter() - t


def compile_s(out: Path) -> float:
    return float(json.loads((out / "manifest.json").read_text())["summary"]["compile_s"])


def processor() -> str:
    """The CPU's model name (figures name their processor), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--images", type=int, default=60, help="toy images (the shapes do not depend on it)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (the runs, the cache)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rdpp-compile-cache-"))
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache"), "RDPP_NO_PROGRESS": "1", "COLUMNS": "150"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # rdpp's own cache folder, empty at first
    ws = root / "ws"
    rdpp(env, "prepro", "toy", "--workspace", str(ws), "--images", str(a.images))
    common = ["--workspace", str(ws), "--device", a.device, "--fast", "on", "--batch-size", str(a.batch_size),
              "--epochs", "1", "--val-images", "8", "--seed", "1"]
    rows = []
    for stage, args in (("train-xe", ["train-xe", "--preset", a.preset, *common]),
                        ("finetune dpp m=5", ["finetune", str(ws / "models" / "xe-run1"), "--reward", "dpp", "--m", "5",
                                              *common])):
        for run in (1, 2):
            out = ws / "models" / f"{stage.split()[0]}-run{run}".replace("train-", "")
            wall = rdpp(env, *args, "--out", str(out))
            rows.append({"stage": stage, "run": run, "compile_s": compile_s(out), "wall_s": wall})
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    where = f"{processor()}, {os.cpu_count()} cores, {a.device}"
    print(f"compile seconds of --fast on (inductor), first run (empty cache) and a second process ({where})")
    print(f"{'stage':20} {'run':>4} {'compile s':>10} {'wall s':>8}")
    for r in rows:
        print(f"{r['stage']:20} {r['run']:>4} {r['compile_s']:>10.1f} {r['wall_s']:>8.1f}")
    for stage in dict.fromkeys(r["stage"] for r in rows):
        first, second = (r["compile_s"] for r in rows if r["stage"] == stage)
        print(f"  {stage}: the second run compiles {first / max(second, 1e-9):.1f}x less")
    if a.json:
        print(json.dumps({"rows": rows, "device": a.device, "where": where}))


if __name__ == "__main__":
    main()
