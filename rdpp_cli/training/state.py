"""Resume state: everything beyond the weights that an interrupted run needs to continue exactly.

``checkpoints/last_state.pt`` holds the model and optimizer state dicts, the LR scheduler, the
loader position ``(epoch, batch)``, the global step, the running sums of the current epoch, the
metrics rows so far, the best validation score, and the RNG states (torch CPU and CUDA, numpy's
global generator, Python's ``random``) of *every* process. Only plain types, so it loads with
``torch.load(weights_only=True)``. It is written atomically (temp file, fsync, rename): a run
killed while saving keeps the previous state.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rdpp_cli.artifacts.manifest import atomic_write
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import non_finite_tensor

STATE_FILE = "last_state.pt"
STATE_VERSION = 1


def atomic_torch_save(obj: Any, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f))


def rng_state() -> dict:
    """This process's RNG states as plain types."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [s for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        cuda = state["cuda"][: torch.cuda.device_count()]
        for i, s in enumerate(cuda):
            torch.cuda.set_rng_state(s, i)
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_state(path: Path, state: dict) -> None:
    atomic_torch_save({"version": STATE_VERSION, **state}, path)


def load_state(path: Path) -> dict:
    """The resume state (weights_only); RdppError when it cannot be read."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RdppError(f"resume state {path} cannot be read ({first}); delete it and pass --no-resume "
                        "to start this run over") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise RdppError(f"resume state {path} is not an rdpp resume state (version {STATE_VERSION}); "
                        "pass --no-resume to start this run over")
    bad = non_finite_tensor(state.get("model") or {})
    if bad is not None:
        raise RdppError(f"resume state {path} holds NaN or infinity in {bad}: the file is damaged (rdpp never saves "
                        "such weights); pass --no-resume to start this run over")
    return state
