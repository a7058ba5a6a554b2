"""`rdpp ls`: every complete artifact of the workspace as a table (settings, headline numbers, model, lineage)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from rdpp_cli.artifacts.lineage import entry_name
from rdpp_cli.artifacts.options import LsOptions
from rdpp_cli.artifacts.workspace import list_artifacts, stray_folders, workspace_dir
from rdpp_cli.console import console, note
from rdpp_cli.options import takes

# The settings worth a glance, per kind (everything is in each manifest's config).
_KEY_SETTINGS = {
    "rdpp.data": ("source", "backbone", "att_size", "images"),
    "rdpp.model": ("architecture", "stage", "preset", "reward", "m", "baseline", "epochs"),
    "rdpp.samples": ("method", "n", "split", "beam", "temperature"),
    "rdpp.scores": ("split", "self_cider_variant"),
}


def model_of(art, by_sha: dict) -> str:
    """The model that made a samples or scores artifact (scores: through their samples), as group/name."""
    entry = art.input_of_kind("rdpp.model")
    samples = art.input_of_kind("rdpp.samples")
    if entry is None and samples and (parent := by_sha.get(samples.get("manifest_sha256"))) is not None:
        entry = parent.input_of_kind("rdpp.model")
    return entry_name(entry) if entry else "-"


def ls(workspace: Path | None = None, arts: list | None = None) -> Table:
    """Every complete artifact in the workspace (``arts``: as ``list_artifacts`` read them) with its
    settings, headline numbers, model and lineage."""
    root = workspace_dir(workspace)
    arts = list_artifacts(root) if arts is None else arts
    by_sha = {a.manifest_sha256: a for a in arts}
    table = Table(title=f"artifacts in {root}", title_justify="left")
    for col in ("artifact", "kind", "created", "settings", "headline", "model", "from"):
        table.add_column(col, overflow="fold")
    for a in arts:
        cfg = a.config
        settings = " ".join(f"{k}={cfg[k]}" for k in _KEY_SETTINGS.get(a.kind, ()) if cfg.get(k) is not None)
        summary = a.manifest.get("summary", {})
        headline = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())
        lineage = ", ".join(entry_name(i) for i in a.inputs)
        model = model_of(a, by_sha) if a.kind in ("rdpp.samples", "rdpp.scores") else "-"
        table.add_row(f"{a.path.parent.name}/{a.name}", a.kind.removeprefix("rdpp."), a.created[:19].replace("T", " "),
                      settings, headline, model, lineage or "-")
    return table


@takes(LsOptions)
def show(opts: LsOptions) -> Table:
    """Print the workspace's table (or say it holds no artifact yet); returns it."""
    arts = list_artifacts(workspace_dir(opts.workspace))
    table = ls(opts.workspace, arts)
    if table.row_count == 0:
        console.print(f"no artifacts in {workspace_dir(opts.workspace)} yet; start with `rdpp prepro toy`")
    else:
        console.print(table)
    stray = stray_folders(opts.workspace, listed={a.path for a in arts})
    if stray:  # one line: folders that are no complete artifact are said, never dropped silently
        note(f"{len(stray)} folder(s) not listed, not complete artifacts: "
             + "; ".join(f"{p.parent.name}/{p.name} ({why})" for p, why in stray) + "; `rdpp verify` checks them")
    return table
