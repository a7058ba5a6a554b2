"""`rdpp table`: print the comparison tables of a workspace's runs (docs/scoring.md#comparison-tables).

Reads only the artifacts' files (scores.json, samples.json, manifests, metrics.csv), so it works
wherever the evaluator is installed; the selection plot and the contact sheet import matplotlib
and PIL only when asked for.
"""

from __future__ import annotations

from pathlib import Path

from rdpp_cli.artifacts.workspace import workspace_dir
from rdpp_cli.errors import RdppError
from rdpp_cli.options import takes
from rdpp_cli.reporting.options import TableOptions, set_sizes
from rdpp_cli.reporting.report import Block, Table, show


def blocks(opts: TableOptions, ws: Path) -> list[Block]:
    """The blocks of ``opts.table`` from the workspace folder ``ws``."""
    if opts.table == "toy":
        from rdpp_cli.reporting.sweeps import toy

        return toy(ws)
    if opts.table == "objective":
        from rdpp_cli.reporting.sweeps import objective

        if opts.against is not None and not Path(opts.against).is_dir():
            raise RdppError(f"--against {opts.against} is not a folder; pass the workspace of the other runs")
        return objective(ws, opts.against)
    if opts.table == "precision":
        from rdpp_cli.reporting.sweeps import precision

        return precision(ws)
    if opts.table == "models":
        from rdpp_cli.reporting.sweeps import models

        return models(ws)
    if opts.table == "selection":
        from rdpp_cli.reporting.selection import selection

        return selection(ws, opts.candidates, set_sizes(opts.ks), opts.plot)
    from rdpp_cli.reporting.real_photos import real_photos

    return real_photos(ws, opts.licenses, opts.sheet)


@takes(TableOptions)
def table(opts: TableOptions) -> list[Block]:
    """Print the tables ``opts.table`` of the workspace as ``opts.format``; returns their blocks."""
    ws = workspace_dir(opts.workspace)
    if not ws.is_dir():
        raise RdppError(f"workspace {ws} does not exist; pass the sweep's workspace with --workspace")
    out = blocks(opts, ws)
    if not any(isinstance(b, Table) and b.rows for b in out):
        raise RdppError(f"no artifacts of `rdpp table {opts.table}` in {ws}; see docs/scoring.md#comparison-tables "
                        "for the names it reads")
    show(out, opts.format)
    return out
