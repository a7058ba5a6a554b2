"""`rdpp export-hf MODEL --out DIR`: a model artifact of ``--model hf`` written back as a Hugging Face
folder: ``VisionEncoderDecoderModel.from_pretrained(DIR)`` loads it, with the vision encoder and
image processor of the folder the model was trained from (``--hf-model`` where it moved; its weights
must be the ones recorded in training) and the trained decoder; its ``generate`` gives rdpp's greedy
captions (tests/test_export_hf.py). ``rdpp export-hf MODEL DIR`` (OUT as an argument) is the same.

- DIR may not be, lie inside or hold what the export reads: the model artifact, the workspace, the
  Hugging Face folder (not even with ``--force``).
- One run at a time writes DIR: a lock file beside it (``artifacts.lock.locked_beside``).
- The folder is written in a temporary folder beside DIR, read back (``models.hf.read_back``: every
  tensor, the generation config and the tokenizer, loaded again and compared with what was written),
  then renamed into place: a refused or failed export leaves DIR as it was.
- ``rdpp-export.json`` in it records the model artifact, the encoder folder and the sha256 of each
  file; ``--force`` replaces only such a folder (an earlier export holding nothing else).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rdpp_cli.artifacts import atomic_write_json, resolve_input, sha256_file, workspace_dir
from rdpp_cli.artifacts.files import write_failure
from rdpp_cli.artifacts.lock import locked_beside
from rdpp_cli.artifacts.workspace import refuse_overlap
from rdpp_cli.captioning.options import ExportHFOptions
from rdpp_cli.console import console, summary_table
from rdpp_cli.decoding.sample import model_checkpoint
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import checkpoint_model_name, load_model
from rdpp_cli.options import takes

MARKER = "rdpp-export.json"  # in an exported folder: what it was made from, and its files' sha256


def _check_out(out: Path, force: bool) -> None:
    """RdppError unless ``out`` is missing, empty, or (with ``force``) an earlier export holding
    nothing but its own files."""
    if out.exists() and not out.is_dir():
        raise RdppError(f"--out {out} is a file; pass a folder path")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise RdppError(f"--out {out} is not empty; pass --force to replace an earlier export there, or another folder")
    import json

    try:
        files = json.loads((out / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise RdppError(f"--out {out} is not an earlier rdpp export-hf folder (no readable {MARKER}); --force "
                        "replaces only such a folder: choose another --out") from None
    others = sorted(p.name for p in out.iterdir() if p.name not in files and p.name != MARKER)
    if others:
        raise RdppError(f"--out {out} holds files that are not its earlier export's ({', '.join(others[:6])}); move "
                        "them out or choose another --out (--force replaces only an earlier export)")


def _swap(tmp: Path, out: Path) -> None:
    """Rename the finished folder ``tmp`` to ``out``, the earlier export there moved aside first."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _export(net, tmp: Path, folder: str, out: Path) -> None:
    """``net.export(tmp, folder)``; a failed write (a full disk: safetensors' ``SafetensorError``, an
    ``OSError`` of a JSON file) as an ``OSError`` naming OUT's file (the CLI's one line)."""
    try:
        net.export(tmp, folder)
    except Exception as e:
        if isinstance(e, OSError) and e.filename:  # a file of the temporary folder: name OUT's
            given = Path(e.filename)
            if not given.is_relative_to(tmp):
                raise
            raise type(e)(e.errno, e.strerror, str(out / given.relative_to(tmp))) from e
        failed = write_failure(e, out / "model.safetensors")  # safetensors' error names no file
        if failed is None:
            raise
        raise failed from e


@takes(ExportHFOptions)
def export_hf(opts: ExportHFOptions) -> Path:
    """Write the model artifact ``opts.model`` as a Hugging Face folder ``opts.out``; returns it."""
    art = resolve_input(opts.model, workspace=opts.workspace, groups=("finetune", "xe"), kind="rdpp.model",
                        what="model", make_with="rdpp train-xe --model hf")
    net, _, ckpt = load_model(model_checkpoint(art))
    if not hasattr(net, "export"):
        raise RdppError(f"model {art.path} is a {checkpoint_model_name(ckpt)} model, which has no Hugging Face form; "
                        "export a model trained with --model hf")
    folder = opts.hf_model or net.config.source
    if not folder or not Path(folder).is_dir():
        raise RdppError(f"the folder {net.config.source} that model {art.path} was trained from is gone; pass "
                        "--hf-model DIR, a save_pretrained folder with its vision encoder")
    out = Path(opts.out)
    ws = workspace_dir(opts.workspace)
    refuse_overlap(out, [art.path, folder, ws if ws.is_dir() else None])
    out.parent.mkdir(parents=True, exist_ok=True)
    with locked_beside(out):
        _check_out(out, opts.replace)
        tmp = out.parent / f".{out.name}.export-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            _export(net, tmp, folder, out)
            atomic_write_json(tmp / MARKER, {
                "model": str(art.path.resolve()), "model_manifest_sha256": art.manifest_sha256,
                "vision_encoder": str(Path(folder).resolve()),
                "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}})
            _swap(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    console.print(summary_table("rdpp export-hf", {
        "folder": out, "model": art.path, "vision encoder": folder,
        "load with": f"VisionEncoderDecoderModel.from_pretrained({str(out)!r})",
        "files": ", ".join(sorted(p.name for p in out.iterdir())),
    }))
    return out
