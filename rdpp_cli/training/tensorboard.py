"""TensorBoard event files beside metrics.csv: ``TensorBoardLogger``, a ``loggers.Logger``.

Written when the ``tensorboard`` package is installed (``pip install tensorboard``, or rdpp's
``tensorboard`` extra); without it nothing is written and one note says how to get them.
metrics.csv stays the source of truth: the events show the same numbers, for
``tensorboard --logdir <artifact>/tensorboard``.

Two runs in the artifact's ``tensorboard/`` folder, both against the optimizer step:

- ``step``: every number the step function logs (``loss``, ``reward``, ``pg_loss``, ...), every step;
- ``epoch``: every column of metrics.csv but ``step`` (the epoch means of those numbers,
  ``val_cider``, ``val_sample_cider``, ``val_self_cider``, ``lr``, ``images_per_s``, ``time``,
  ``epoch``) at the step that ended the epoch.

A tag in both runs (``loss``) draws the steps and their epoch means in one chart.

Resume: a resumed run continues from its resume state at step S; the events the interrupted run
wrote after S are orphans. The ``step`` writer opens with a restart marker at S + 1
(``SummaryWriter(purge_step=S + 1)``), and its first event is at S + 1, so TensorBoard drops the
orphans (its Python loader by the marker, its data server because the steps go back) and shows
steps 1..S once each, then the new ones. The ``epoch`` writer marks a restart at 0 and writes the
resume state's rows again, so the epoch run is metrics.csv whatever moment the run died at. The
events are flushed to disk every ``FLUSH_SECONDS`` (a GPU run takes tens of steps a second, and a
flush per step costs a write each) and always before a resume state is written (``before_save``),
so a killed run has written every step up to its resume state. A run that starts at step 0 (a new
one, or ``--no-resume``) removes the folder's earlier events first.

The manifest: the writers are closed when the run ends, before the manifest is written, so the
event files are files of the artifact like any other, hashed and checked by ``rdpp verify``.

A full disk: the writers write in a thread of their own, which fails first and hands its error to
the run's thread at the next event or flush. That thread prints no traceback (``_quiet_writer_threads``);
the run's error names the events folder, and the stage says it in one line like any failed write.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from rdpp_cli.console import note
from rdpp_cli.training.loggers import Logger
from rdpp_cli.training.loop import current_position

TENSORBOARD = "tensorboard"
FLUSH_SECONDS = 30  # the writers' flush interval (SummaryWriter's flush_secs; its default is 120)
INSTALL = "pip install tensorboard"


def summary_writer_class():
    """``torch.utils.tensorboard.SummaryWriter``, or None when the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401  checked first: an already imported torch module would hide its absence
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


def wait_past_event_files(log_dir: Path) -> None:
    """Wait until the clock's second is past that of every event file under ``log_dir``: TensorBoard
    reads a run's files in name order, and a file's name starts with the second it was made in, so a
    resumed run's files must sort after those of the run it continues (at most a second's wait)."""
    stamps = [int(p.name.split(".")[3]) for p in log_dir.glob("*/events.out.tfevents.*")
              if p.name.split(".")[3].isdigit()]
    if stamps:
        time.sleep(max(0.0, max(stamps) + 1 - time.time()))


@functools.cache
def _quiet_writer_threads() -> None:
    """An OSError in TensorBoard's writer thread (a full disk) is not printed as that thread's traceback:
    the writer raises it again in the run's thread at its next event or flush (``_events_of``)."""
    previous = threading.excepthook

    def hook(args):
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    threading.excepthook = hook


@contextlib.contextmanager
def _events_of(folder: Path):
    """A failed write of TensorBoard's as an OSError naming the events ``folder`` (its own names none)."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(folder)) from e


class TensorBoardLogger(Logger):
    """The run's numbers as TensorBoard events in ``log_dir`` (the artifact's ``tensorboard/``)."""

    def __init__(self, log_dir: Path | str):
        self.log_dir = Path(log_dir)
        self.steps = self.epochs = None  # the two writers while the run writes
        self.written = False

    def start(self, history: list[dict[str, Any]]) -> None:
        writer = summary_writer_class()
        if writer is None:
            note(f"no TensorBoard events: the tensorboard package is not installed ({INSTALL}); "
                 "metrics.csv has every number")
            return
        pos = current_position()
        step = pos.step if pos is not None else 0
        if step == 0 and self.log_dir.exists():  # a run from the start: earlier events are another run's
            shutil.rmtree(self.log_dir)
        wait_past_event_files(self.log_dir)
        _quiet_writer_threads()
        with _events_of(self.log_dir / "step"):
            self.steps = writer(str(self.log_dir / "step"), purge_step=step + 1 if step else None,
                                flush_secs=FLUSH_SECONDS)
        with _events_of(self.log_dir / "epoch"):
            self.epochs = writer(str(self.log_dir / "epoch"), purge_step=0 if step else None, flush_secs=FLUSH_SECONDS)
            for row in history:
                self._add_row(row)
            self.epochs.flush()
        self.written = True
        note(f"TensorBoard events in {self.log_dir}; open them with: tensorboard --logdir {self.log_dir}")

    def log_step(self, step: int, logs: dict[str, float]) -> None:
        if self.steps is None:
            return
        with _events_of(self.log_dir / "step"):
            for name, value in logs.items():
                self.steps.add_scalar(name, value, step)

    def before_save(self, step: int) -> None:
        for name, w in (("step", self.steps), ("epoch", self.epochs)):
            if w is not None:
                with _events_of(self.log_dir / name):
                    w.flush()

    def log_epoch(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        if self.epochs is None:
            return
        with _events_of(self.log_dir / "epoch"):
            self._add_row(row)
            self.epochs.flush()

    def _add_row(self, row: dict[str, Any]) -> None:
        for name, value in row.items():
            if name != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool):
                self.epochs.add_scalar(name, value, row["step"])

    def close(self) -> None:
        writers, self.steps, self.epochs = (("step", self.steps), ("epoch", self.epochs)), None, None
        for name, w in writers:
            if w is not None:
                with _events_of(self.log_dir / name):
                    w.close()

    def summary_rows(self) -> list[tuple[str, Any]]:
        return [("tensorboard", self.log_dir)] if self.written else []
