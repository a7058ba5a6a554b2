"""What a training run reports to, on rank 0: ``Logger`` (the interface), ``MetricsCsv``
(metrics.csv) and ``PendingLogs`` (the fast path's step numbers kept on the device until read).
TensorBoard's logger is ``rdpp_cli.training.tensorboard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from rdpp_cli.artifacts import atomic_write_bytes


class Logger:
    """Receives a run's numbers on rank 0; subclasses override what they need."""

    def start(self, history: list[dict[str, Any]]) -> None:
        """The run begins; ``history``: the epoch rows of the interrupted run it continues (or [])."""

    def log_step(self, step: int, logs: dict[str, float]) -> None:
        """After every optimizer step: the step function's numbers ("loss", ...). With the fast path
        they come when they are read back from the device, every few steps, in step order."""

    def log_epoch(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """After every epoch (its checkpoints saved): its row of metrics, and every row so far."""

    def before_save(self, step: int) -> None:
        """Before the resume state at optimizer step ``step`` is written: what a resumed run expects
        on disk up to that step must be there (a killed run resumes from that state)."""

    def close(self) -> None:
        """The run ended, finished or not."""

    def summary_rows(self) -> list[tuple[str, Any]]:
        """Rows for the stage's closing table (e.g. where the logger wrote)."""
        return []


class MetricsCsv(Logger):
    """``metrics.csv``: one row per epoch, the whole file rewritten atomically after each."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def start(self, history: list[dict[str, Any]]) -> None:
        if history:  # a resumed run: the file as its resume state has it
            self._write(history)

    def log_epoch(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        self._write(history)

    def _write(self, history: list[dict[str, Any]]) -> None:
        atomic_write_bytes(self.path, pd.DataFrame(history).to_csv(index=False).encode())


class PendingLogs:
    """Steps' numbers kept where they were computed (the device) and read back every ``every``
    steps in one transfer, so that a step never waits for the device (the fast path)."""

    def __init__(self, every: int):
        self.every = max(1, int(every))
        self.items: list[tuple[int, int, dict[str, Any]]] = []

    def add(self, step: int, images: int, logs: dict[str, Any]) -> bool:
        """Keep one step's numbers; True when ``every`` steps are waiting to be read."""
        self.items.append((step, images, logs))
        return len(self.items) >= self.every

    def read(self) -> list[tuple[int, int, dict[str, float]]]:
        """The waiting steps ``(step, images, {name: float})``, in order; empties the buffer."""
        items, self.items = self.items, []
        tensors = [v for _, _, logs in items for v in logs.values() if isinstance(v, Tensor)]
        values = iter(())
        if tensors:
            dev = tensors[0].device
            values = iter(torch.stack([t.reshape(()).to(dev, torch.float64) for t in tensors]).tolist())
        return [(step, images, {k: next(values) if isinstance(v, Tensor) else v for k, v in logs.items()})
                for step, images, logs in items]
