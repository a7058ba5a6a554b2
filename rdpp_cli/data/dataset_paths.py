"""Where ``rdpp prepro coco`` looks for COCO when no path is given.

Caption file (first that exists): ``--karpathy-json`` (or ``karpathy_json`` in the ``prepro_coco``
section of ``<workspace>/rdpp.yaml`` / ``--config``), ``$RDPP_COCO_ROOT/dataset_coco.json``,
``./data/coco/dataset_coco.json``.

Image root (first that holds the caption file's first image): ``--images-root`` (or
``images_root`` in the same places), ``$RDPP_COCO_ROOT/images``, ``$RDPP_COCO_ROOT``,
``./data/coco/images``, ``./data/coco``, the caption file's own folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from rdpp_cli.errors import RdppError

ENV_ROOT = "RDPP_COCO_ROOT"
DEFAULT_ROOT = Path("data/coco")
JSON_NAME = "dataset_coco.json"


def _roots() -> list[Path]:
    env = os.environ.get(ENV_ROOT)
    return ([Path(env)] if env else []) + [DEFAULT_ROOT]


def find_karpathy_json(given: Path | None, workspace: Path | None = None) -> Path:
    """The caption file to read: ``given`` when set (checked later), else the first default that exists."""
    if given is not None:
        return Path(given)
    candidates = [r / JSON_NAME for r in _roots()]
    for c in candidates:
        if c.is_file():
            return c
    from rdpp_cli.artifacts.workspace import WORKSPACE_YAML, workspace_dir

    env = "" if os.environ.get(ENV_ROOT) else f" (${ENV_ROOT} unset)"
    raise RdppError(
        f"no COCO caption file found: looked at {', '.join(str(c) for c in candidates)}{env} and "
        f"karpathy_json in the prepro_coco section of {workspace_dir(workspace) / WORKSPACE_YAML}; pass --karpathy-json PATH/{JSON_NAME} and --images-root DIR "
        "(or set $RDPP_COCO_ROOT), or try the bundled set with `rdpp prepro toy`")


def find_images_root(given: Path | None, json_path: Path, first_relpath: str) -> Path:
    """The folder the caption file's relative image paths start from."""
    if given is not None:
        given = Path(given)
        if not given.is_dir():
            raise RdppError(f"--images-root {given} is not a folder; pass the folder holding the images "
                            "(e.g. the one with train2014/ and val2014/)")
        return given
    candidates = []
    for r in _roots():
        candidates += [r / "images", r]
    candidates.append(Path(json_path).parent)
    for c in candidates:
        if c.is_dir() and (c / first_relpath).is_file():
            return c
    raise RdppError(
        f"no image folder holding {first_relpath} found: looked in {', '.join(str(c) for c in candidates)}; "
        "pass --images-root DIR (the folder with train2014/ and val2014/), or --features-from PATH")
