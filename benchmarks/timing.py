"""How every benchmark here times two implementations: the same inputs, the same number of runs,
interleaved, medians (the project rule; benchmarks/README.md).

``interleaved({"pycocoevalcap": f, "rdpp": g}, repeat=7)`` runs f, g, g, f, f, g, ... (one run of
each per round, the order reversed every other round so that neither always runs right after the
other), so that on a shared machine both sample the same stretches of load; it returns each
side's run times and last result. Ratios are taken between medians; the best run may be shown
beside them.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    times: list[float]  # seconds, one per run
    result: Any  # the last run's return value

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int,
                clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Each function ``repeat`` times, one run of each per round: in the order given, then reversed.
    ``clock``: wall time by default; ``time.process_time`` counts this process's CPU time."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    out = {name: Timing([], None) for name in fns}
    items = list(fns.items())
    for k in range(repeat):
        for name, fn in (items if k % 2 == 0 else items[::-1]):
            t = clock()
            res = fn()
            out[name].times.append(clock() - t)
            out[name].result = res
    return out


def machine() -> str:
    """One line for a table's caption: CPU, cores, and the load average when the run ended."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{cpu}, {os.cpu_count()} cores, load average {load} (1/5/15 min)"
