"""How every benchmark here times two implementations: the same inputs, the same number of runs,
interleaved, medians (the project rule; benchmarks/README.md). ``interleaved`` runs f, g, g, f, f, g, ...
(the order reversed every other round), so that on a shared machine both sides sample the same
stretches of load; ratios are taken between medians, the best run may be shown beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Timing:
    times: list[float]  # seconds, one per run
    results: list  # the runs' return values (interleaved: the last run's alone, unless keep)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    def ms(self, digits: int = 1) -> str:
        """``"12.3 ms (best 11.9)"``: the median in milliseconds, the best run beside it."""
        return f"{self.median * 1e3:.{digits}f} ms (best {self.best * 1e3:.{digits}f})"


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int, before: Callable[[str], Any] | None = None,
                keep: bool = False) -> dict[str, Timing]:
    """Each function ``repeat`` times, one run of each per round, wall time: in the order given, then
    reversed. ``before(name)``: called untimed before each run (e.g. dropping a file from the page
    cache). ``keep``: every run's return value in ``results`` (else the last run's alone)."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    out = {name: Timing([], []) for name in fns}
    items = list(fns.items())
    for k in range(repeat):
        for name, fn in (items if k % 2 == 0 else items[::-1]):
            if before is not None:
                before(name)
            t = time.perf_counter()
            res = fn()
            out[name].times.append(time.perf_counter() - t)
            out[name].results = [*out[name].results, res] if keep else [res]
    return out


def machine() -> str:
    """One line for a table's caption: CPU, cores, and the load average when the run ended."""
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")),
               platform.processor() or platform.machine())
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores, load average {load} (1/5/15 min)"


def parser(doc: str, json: bool = True, **kw) -> argparse.ArgumentParser:
    """The options every script shares: its description (the docstring's first line) and --json."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0], **kw)
    if json:
        ap.add_argument("--json", action="store_true", help="also print one JSON line with every number")
    return ap


def subcommands(doc: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Callable]:
    """(parser, ``shared``: the options, --json first, of each ``add(name, help)`` subcommand added after
    them; ``add(..., shared=False)``: --json alone) of a script of subcommands."""
    ap, common, alone = parser(doc, json=False), parser(doc, add_help=False), parser(doc, add_help=False)
    sub = ap.add_subparsers(dest="what", required=True)
    return ap, common, lambda name, help, shared=True: sub.add_parser(name, parents=[common if shared else alone],
                                                                   help=help)


def run_bench(name: str, bench: Callable[[], dict], show: Callable, args, work: Path | None = None,
              key: str | None = None, **extra) -> None:
    """``show(bench(), args)``, the start's load average, the machine; ``work`` removed unless ``args.keep``;
    ``--json``: the line ``{"benchmark": name, ..., **extra}`` with the result's fields (or as ``key``)."""
    load0 = os.getloadavg()
    try:
        res = bench()
    finally:
        if work is not None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    show(res, args)
    print(f"load average {load0[0]:.1f} at the start; {machine()}")
    if args.json:
        print(json.dumps({"benchmark": name, "cpus": os.cpu_count(), "machine": machine(),
                          "load_average_start_end": [load0, os.getloadavg()], **extra, **({key: res} if key else res)}))


def reused(spec: Path, want: dict, make: Callable[[], dict]) -> dict:
    """``make()``'s record (and ``build_s``, its seconds), kept in ``spec`` beside what it made: a
    rerun with the same ``want`` (files kept with ``--keep``) reuses them."""
    if not (spec.is_file() and json.loads(spec.read_text()).get("want") == want):
        t0 = time.perf_counter()
        made = make()
        spec.write_text(json.dumps({**made, "build_s": time.perf_counter() - t0, "want": want}))
    return json.loads(spec.read_text())


def print_table(title: str, columns, rows, width: int = 160, left: int = 1) -> None:
    """One table on the console: the first ``left`` columns left-aligned, the others right; ``rows``
    of values (str() of each)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for k, c in enumerate(columns):
        t.add_column(c, justify="left" if k < left else "right")
    for r in rows:
        t.add_row(*map(str, r))
    Console(width=width).print(t)


# -- training steps (benchmarks/models_speed.py): warm-up, FLOPs, peak memory, roofline ----------------------------

def sync(device) -> None:
    """Wait for a CUDA device's queued work (nothing on a CPU)."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def peak_mib(fn: Callable[[], Any], device) -> float:
    """Peak memory (MiB) of one call of fn above what was in use before it: CUDA's allocator peak, or
    on a CPU the resident memory sampled every 2 ms, freed heap memory handed back to the OS first
    (``malloc_trim``) so that what an earlier call left cached in the allocator does not hide this one's."""
    import ctypes
    import threading

    import torch

    if getattr(device, "type", "cpu") == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    with contextlib.suppress(OSError):  # not glibc: nothing to hand back
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    rss = lambda: int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # noqa: E731
    base = peak = rss()
    done = threading.Event()

    def watch():
        nonlocal peak
        while not done.wait(0.002):
            peak = max(peak, rss())

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return (max(peak, rss()) - base) / 2**20


def count_gflop(fn: Callable[[], Any]) -> float:
    """GFLOP of the matrix products in one call of fn (torch.utils.flop_counter; elementwise work
    is not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops() / 1e9


def matmul_gflops(precision: str, device, n: int = 4096, repeats: int = 3) -> float:
    """Median GFLOP/s of an n x n by n x n ``torch.mm`` in ``precision`` (fp32, bf16, fp16) on
    ``device``: the roofline that "fraction of the matmul rate" refers to."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(dtype)
    b = torch.randn(n, n, generator=g, device=device).to(dtype)
    torch.mm(a, b)
    sync(device)
    return 2 * n**3 / interleaved({"mm": lambda: (torch.mm(a, b), sync(device))}, repeats)["mm"].median / 1e9


def steps(sides: dict[str, Callable[[], Any]], repeat: int, device, flops=None) -> dict[str, dict]:
    """Training steps timed the project's way: each side called once to warm up (its FLOPs counted
    on that call), once more for its peak memory (untimed: handing freed memory back to the OS
    before a timed call would add page faults to it), then ``interleaved`` ``repeat`` times, each
    call waiting for the device. Per side: ``times``, ``median``, ``best``, ``gflop``, ``peak_mib``
    and ``results`` (what every timed call returned). ``flops``: the sides whose FLOPs are counted
    (default all; a compiled side is not: the counter's dispatch mode breaks its graph), the others warm up plainly."""
    gflop = {name: count_gflop(fn) if flops is None or name in flops else (fn(), float("nan"))[1]
             for name, fn in sides.items()}
    peak = {name: peak_mib(fn, device) for name, fn in sides.items()}
    t = interleaved({name: (lambda fn=fn: (fn(), sync(device))[0]) for name, fn in sides.items()}, repeat, keep=True)
    return {name: {"times": t[name].times, "median": t[name].median, "best": t[name].best, "gflop": gflop[name],
                   "peak_mib": peak[name], "results": t[name].results} for name in sides}


def on_roofline(run: Callable[[], Any], precisions, device, matmul_size: int = 4096) -> tuple[Any, dict]:
    """``run()`` between two measurements of the matmul rate of every precision in ``precisions`` (and
    fp32): the roofline, measured in the same run. Returns ``(run(), {precision: median GFLOP/s})``."""
    rates = {p: [matmul_gflops(p, device, matmul_size)] for p in sorted({"fp32", *precisions})}
    out = run()
    return out, {p: statistics.median([*v, matmul_gflops(p, device, matmul_size)]) for p, v in rates.items()}


def machine_info() -> dict:
    """What the numbers were measured on, for the JSON line: ``machine()`` plus threads, OpenMP's
    wait policy, torch and the GPU."""
    import torch

    return {"machine": machine(), "threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


# -- cold reads (benchmarks/data.py): files out of the page cache -----------------------------------------------

def drop_cache(paths) -> str:
    """Drop ``paths`` from the page cache: ``posix_fadvise(DONTNEED)`` per file (clean pages of
    just these files; needs no privilege and leaves other users' caches alone), checked with
    ``fincore`` where it exists; ``/proc/sys/vm/drop_caches`` (whole machine, root only) if pages
    stayed. Returns the method that worked, or "none"."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    left = [cached_fraction(Path(p)) for p in paths]
    if all(x is not None and x < 0.01 for x in left):
        return "fadvise"
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        return "fadvise (unchecked)" if all(x is None for x in left) else "none"


def cached_fraction(path: Path) -> float | None:
    """Share of ``path``'s pages in the page cache (util-linux ``fincore``), None if unavailable."""
    if not shutil.which("fincore"):
        return None
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                       capture_output=True, text=True)
    try:
        return int(p.stdout.split()[0]) / path.stat().st_size
    except (ValueError, IndexError, ZeroDivisionError):
        return None
