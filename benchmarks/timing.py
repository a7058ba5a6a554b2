"""How benchmarks/train.py and benchmarks/finetune.py measure (shared, so both follow one rule).

- ``interleaved``: every side is called once to warm up, then the sides take turns (A B C A B C
  ...) for the same number of timed calls, so a change in the machine's load hits all alike; each
  side's median and best are reported, and every published ratio is a ratio of medians.
- peak memory of each timed call: CPU resident memory above the level before the call (sampled
  every 2 ms, with freed heap handed back first), or CUDA's allocator peak;
- ``count_gflop``: the matrix products of one call counted with ``torch.utils.flop_counter``
  (elementwise work is not counted);
- ``matmul_gflops``: the rate of a plain n x n matrix product in a dtype on this device -- the
  roofline that "fraction of the matmul rate" refers to, measured in the same run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms (CPU). Freed heap memory
    is handed back to the OS first (``malloc_trim``), so that what an earlier call left cached in
    the allocator does not hide this one's peak."""

    def __enter__(self):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        self.base = self.peak = self._rss()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, self._rss())

    @property
    def mib(self) -> float:
        return (self.peak - self.base) / 2**20


def timed_call(fn: Callable, device: torch.device):
    """(seconds, peak MiB, fn's result) of one call; the clock covers the GPU's work."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        t = time.perf_counter()
        out = fn()
        sync(device)
        dt = time.perf_counter() - t
        return dt, (torch.cuda.max_memory_allocated(device) - base) / 2**20, out
    with PeakRSS() as mem:
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
    return dt, mem.mib, out


def interleaved(sides: dict[str, Callable], repeats: int, device: torch.device, warmup: int = 1,
                on_warmup: Callable[[str, Callable], None] | None = None) -> dict[str, dict]:
    """Each side warmed up ``warmup`` times (the first warm-up call goes through ``on_warmup(name,
    fn)`` when given, e.g. to count its FLOPs), then called ``repeats`` times in turns.

    Returns per side: ``times`` (s), ``median``, ``best``, ``peak_mib`` (largest over the timed
    calls) and ``results`` (what each timed call returned)."""
    for _ in range(warmup):
        for name, fn in sides.items():
            if on_warmup is not None and _ == 0:
                on_warmup(name, fn)
            else:
                fn()
    sync(device)
    out = {k: {"times": [], "peak_mib": 0.0, "results": []} for k in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            dt, mib, res = timed_call(fn, device)
            o = out[name]
            o["times"].append(dt)
            o["peak_mib"] = max(o["peak_mib"], mib)
            o["results"].append(res)
    for o in out.values():
        o["median"] = float(np.median(o["times"]))
        o["best"] = float(np.min(o["times"]))
    return out


def count_gflop(fn: Callable) -> tuple[float, object]:
    """(GFLOP of the matrix products in one call of fn, fn's result)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        out = fn()
    return fc.get_total_flops() / 1e9, out


def matmul_gflops(precision: str, device: torch.device, n: int = 4096, repeats: int = 3) -> float:
    """Median GFLOP/s of an n x n by n x n product (``torch.mm``) in ``precision`` on ``device``
    (operands already in that dtype, as autocast hands them to the products)."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(DTYPES[precision])
    b = torch.randn(n, n, generator=g, device=device).to(DTYPES[precision])
    torch.mm(a, b)
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n**3 / float(np.median(times)) / 1e9


def machine() -> dict:
    """What the numbers were measured on: CPU model, threads, load average, OpenMP wait policy."""
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
