"""`rdpp demo`: the whole chain on the bundled dataset, reusing what is already complete.

prepro toy -> train-xe -> finetune scst -> finetune dpp (m=5) -> sample (random n=10; beam 3)
-> score (oracle, self-CIDEr, diversity) -> plot, ending with one table comparing the models and
the compare page of their random samples (`rdpp compare`).
Every step is the same plain function the stage's command calls; a step whose artifact already
exists in the workspace with the same settings and inputs is reused, so a second run is fast.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from rdpp_cli.artifacts import Artifact, atomic_write_json, find_reusable, read_artifact, workspace_dir
from rdpp_cli.console import console, info
from rdpp_cli.options import Options, device_option, option, takes


@dataclass
class DemoOptions(Options):
    """`rdpp demo`."""

    section = "demo"

    out: Path | None = option(None, "Workspace for the demo's artifacts (default: $RDPP_WORKSPACE, else ./runs).",
                              "--out", "--workspace", identity=False, record=False)
    quick: bool = option(False, "A smoke run of the same chain (about 2 minutes on 2 CPU cores).")
    device: str = device_option("cpu")


@dataclass(frozen=True)
class DemoPlan:
    """The demo's settings; ``quick`` is a smoke run of the same chain."""

    images: int = 3000
    # Settings of the toy sweep in docs/experiments.md (XE lr 1e-3 decaying 0.8 every 3 epochs; RL lr
    # 1e-4), with fewer epochs so that the full demo fits in a few minutes on 2 CPU cores (2 min 42 s idle).
    xe: dict = field(default_factory=lambda: {"preset": "small", "epochs": 6, "batch_size": 50, "lr": 1e-3,
                                              "val_images": 150, "seed": 123})
    rl: dict = field(default_factory=lambda: {"epochs": 3, "batch_size": 50, "lr": 1e-4, "val_images": 150,
                                              "seed": 123})
    dpp_m: int = 5
    n: int = 10
    beam: int = 3
    seed: int = 0

    @classmethod
    def quick(cls) -> "DemoPlan":
        """A small run of the same chain that already shows the trade-off: 500 images, XE long enough
        to caption (beam-3 CIDEr ~0.6; 200 images and 2 epochs left every beam caption empty), then
        240 RL steps of 10 images at lr 1e-3 (the last checkpoint: 20 val images are too few to pick
        one), enough for SCST to collapse its samples. With RL seeds 123, 1, 2, 3 and 7 R-DPP kept
        1.9-8.8x SCST's self-CIDEr with a higher oracle (tests/test_demo.py checks the seeded run)."""
        return cls(images=500,
                   xe={"preset": "small", "epochs": 4, "batch_size": 25, "lr": 2e-3, "val_images": 20, "seed": 123},
                   rl={"epochs": 6, "batch_size": 10, "lr": 1e-3, "val_images": 0, "seed": 123}, n=10)


def _step(title: str, workspace: Path, group: str, settings: dict, inputs: list[Artifact], run) -> Artifact:
    found = find_reusable(workspace, group, settings, inputs)
    if found is not None:
        info(f"[green]✓[/green] {title}: reusing {found.path}")
        return found
    info(f"[bold]▶ {title}[/bold]")
    t0 = time.perf_counter()
    made = run()
    art = made if isinstance(made, Artifact) else read_artifact(made)
    info(f"[green]✓[/green] {title}: {art.path} ({time.perf_counter() - t0:.0f} s)")
    return art


def _models(plan: DemoPlan, ws: Path, device: str) -> tuple[Artifact, dict[str, Artifact]]:
    """The data artifact and the three models: XE, SCST and R-DPP fine-tuned from it."""
    from rdpp_cli.data.toy import prepro_toy
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    data = _step("prepro toy", ws, "data", {"images": plan.images, "seed": plan.seed}, [],
                 lambda: prepro_toy(workspace=ws, images=plan.images, seed=plan.seed))
    xe = _step("train-xe", ws, "xe", plan.xe, [data],
               lambda: train_xe(data.path, workspace=ws, device=device, **plan.xe))
    models = {"XE": xe}
    for label, reward in (("SCST", {"reward": "scst"}), (f"R-DPP m={plan.dpp_m}", {"reward": "dpp", "m": plan.dpp_m})):
        settings = {**reward, **plan.rl}
        models[label] = _step(f"finetune {reward['reward']}", ws, "finetune", settings, [xe],
                              lambda s=settings: finetune(xe.path, data=data.path, workspace=ws, device=device, **s))
    return data, models


def _evaluate(label: str, model: Artifact, data: Artifact, plan: DemoPlan, ws: Path, device: str
              ) -> tuple[dict, Artifact, Path]:
    """One model's row of the comparison (random samples scored with oracle and diversity, beam
    search scored for accuracy), its random samples and the folder of their scores."""
    from rdpp_cli.decoding.sample import sample
    from rdpp_cli.scoring.score import score

    rand_cfg = {"method": "random", "n": plan.n, "split": "test", "seed": plan.seed}
    rand = _step(f"sample {label} (random, n={plan.n})", ws, "samples", rand_cfg, [model],
                 lambda: sample(model.path, data=data.path, workspace=ws, device=device, **rand_cfg))
    beam_cfg = {"method": "beam", "n": 1, "beam": plan.beam, "split": "test"}
    beam = _step(f"sample {label} (beam {plan.beam})", ws, "samples", beam_cfg, [model],
                 lambda: sample(model.path, data=data.path, workspace=ws, device=device, **beam_cfg))
    s_rand = _step(f"score {label} samples", ws, "scores", {"oracle": True, "self_cider": True, "diversity": True,
                                                            "metrics": ["CIDEr"]}, [rand],
                   lambda: score(rand.path, oracle=True, self_cider=True, diversity=True, metrics="CIDEr",
                                 workspace=ws))
    s_beam = _step(f"score {label} beam", ws, "scores", {"oracle": False, "metrics": ["CIDEr"]}, [beam],
                   lambda: score(beam.path, metrics="CIDEr", workspace=ws))
    r = json.loads(s_rand.file("scores.json").read_text())  # reused ones are checked too
    b = json.loads(s_beam.file("scores.json").read_text())
    row = {
        "beam_cider": b["accuracy"]["CIDEr"],
        "mean_cider": r["accuracy"]["CIDEr"],
        "oracle_cider": r["oracle"]["CIDEr"],
        "self_cider": r["diversity"]["self_cider"],
        "div2": r["diversity"]["div2"],
        "model": str(model.path),
    }
    return row, rand, s_rand.path


def _print_table(rows: dict[str, dict], plan: DemoPlan, quick: bool) -> None:
    table = Table(title=f"rdpp demo ({'quick' if quick else 'full'}): {plan.images} toy images, "
                        f"{plan.n} random samples per test image", title_justify="left")
    for col in ("model", f"CIDEr (beam {plan.beam})", "mean CIDEr (samples)", f"oracle CIDEr (best of {plan.n})",
                "self-CIDEr ↑", "Div-2 ↑"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for label, r in rows.items():
        table.add_row(label, *(f"{r[k]:.3f}" for k in ("beam_cider", "mean_cider", "oracle_cider", "self_cider", "div2")))
    console.print(table)


@takes(DemoOptions)
def demo(opts: DemoOptions) -> dict:
    """Run the chain in workspace ``opts.out`` (default: the workspace); returns the comparison rows."""
    from rdpp_cli.reporting.compare import compare
    from rdpp_cli.scoring.plot import plot_scores

    plan = DemoPlan.quick() if opts.quick else DemoPlan()
    ws = workspace_dir(opts.out)
    ws.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data, models = _models(plan, ws, opts.device)
    rows: dict[str, dict] = {}
    score_dirs: list[Path] = []
    samples: list[Artifact] = []
    for label, model in models.items():
        rows[label], rand, scores = _evaluate(label, model, data, plan, ws, opts.device)
        samples.append(rand)
        score_dirs.append(scores)
    plot_path = plot_scores(score_dirs, ws / "demo_plot.png", labels=list(models))
    _print_table(rows, plan, opts.quick)
    labels = ",".join(models)
    page = _step("compare", ws, "compare", {"labels": labels}, samples,
                 lambda: compare([str(a.path) for a in samples], labels=labels, workspace=ws)).path / "index.html"
    console.print(f"plot: {plot_path}   compare page: {page}   workspace: {ws}   ({time.perf_counter() - t_start:.0f} s)   "
                  f"see every artifact with `rdpp ls --workspace {ws}`")
    result = {"rows": rows, "plot": str(plot_path), "compare": str(page), "workspace": str(ws)}
    atomic_write_json(ws / "demo_summary.json", result)
    return result
