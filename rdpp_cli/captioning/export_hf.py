"""`rdpp export-hf MODEL OUT`: a model artifact of ``--model hf`` written back as a Hugging Face
folder: ``VisionEncoderDecoderModel.from_pretrained(OUT)`` loads it, with the vision encoder and
image processor of the folder the model was trained from (``--hf-model`` where it moved) and the
trained decoder; its ``generate`` gives rdpp's greedy captions (tests/test_model_hf.py).

OUT is written in a temporary folder beside it and renamed into place, so a refused or failed
export leaves nothing; an OUT that holds files is replaced only with ``--force``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rdpp_cli.artifacts import resolve_input
from rdpp_cli.captioning.options import ExportHFOptions
from rdpp_cli.console import console, summary_table
from rdpp_cli.decoding.sample import model_checkpoint
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import checkpoint_model_name, load_model
from rdpp_cli.options import takes


def _check_out(out: Path, model_dir: Path, force: bool) -> None:
    if out.resolve() == model_dir.resolve() or model_dir.resolve() in out.resolve().parents:
        raise RdppError(f"OUT {out} is inside model artifact {model_dir}; write the Hugging Face folder elsewhere")
    if out.exists() and not out.is_dir():
        raise RdppError(f"OUT {out} is a file; pass a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RdppError(f"OUT {out} is not empty; pass --force to replace it, or another folder")


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
    _check_out(out, art.path, opts.replace)
    tmp = out.parent / f".{out.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        net.export(tmp, folder)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    console.print(summary_table("rdpp export-hf", {
        "folder": out, "model": art.path, "vision encoder": folder,
        "load with": f"VisionEncoderDecoderModel.from_pretrained({str(out)!r})",
        "files": ", ".join(sorted(p.name for p in out.iterdir())),
    }))
    return out
