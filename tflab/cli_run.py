"""`tflab run`: one task across the lab, in order, to a verdict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tflab import engine, launcher, nodes, tasks, views
from tflab.cli import LabOption, app, console
from tflab.cli_lab import open_lab
from tflab.errors import UserError
from tflab.labfiles import LabFiles


def fresh_run_dir(lf: LabFiles, task: str, resume: bool) -> Path:
    """The host side of /runs/TASK: a previous run's is moved aside unless resuming."""
    folder = lf.runs_dir / task
    if folder.exists() and not resume:
        folder.rename(lf.runs_dir / f"{task}.{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def summary(lf: LabFiles, runs: list[launcher.NodeRun]) -> Table:
    """node, role, exit, duration, steps/s, verdict."""
    table = Table(title="run summary")
    for column in ("node", "role", "exit", "duration", "steps/s", "verdict"):
        table.add_column(column)
    for run in runs:
        rate = run.steps_per_second()
        colour = {"ok": "green", "served": "green", "failed": "red", "hung": "red"}.get(run.verdict, "yellow")
        table.add_row(
            run.node.name,
            views.role_text(lf.lab, run.node),
            "-" if run.exit_code is None or run.verdict in ("served", "stopped") else str(run.exit_code),
            f"{run.duration:.1f}s",
            f"{rate:.1f}" if rate else "-",
            Text(run.verdict + (f" (attempt {run.attempt})" if run.attempt > 1 else ""), style=colour),
        )
    return table


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="A task of tflab.yaml.")],
    grace: Annotated[float, typer.Option(help="Seconds workers may outlive the chief before they count as hung.")] = 30.0,
    timeout: Annotated[float | None, typer.Option(help="Seconds the whole run may take.")] = None,
    restarts: Annotated[int, typer.Option(help="Restarts allowed for each failed non-chief worker.")] = 0,
    resume: Annotated[bool, typer.Option(help="Keep the previous run's outputs (resume from its checkpoint).")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Run TASK on every node: servers first (waited on), then workers; exit 0 only if all workers succeed."""
    lf = open_lab(lab)
    definition = lf.config.task(task)
    if restarts < 0:
        raise UserError("--restarts cannot be negative")
    client = engine.client()
    containers = {name: nodes.running_container(client, lf.project, name) for name in lf.lab.names}
    folder = fresh_run_dir(lf, task, resume)
    out = console()
    colours = dict(zip(lf.lab.names, views.NODE_COLOURS * 8))

    def on_line(node: str, line: str) -> None:
        prefix = Text(f"[{node}] ", style=f"bold {colours[node]}")
        out.print(prefix + Text(line), soft_wrap=True)

    def on_event(message: str) -> None:
        out.print(Text(f"tflab: {message}", style="bold"), soft_wrap=True)

    supervisor = launcher.Supervisor(
        client, containers, lf.lab, definition,
        {name: tasks.task_argv(lf, name, task) for name in lf.lab.names},
        tasks.task_env(task), folder / "logs", on_line, on_event,
        launcher.RunOptions(grace_s=grace, timeout_s=timeout, restarts=restarts),
    )
    servers, finishers = launcher.start_order(lf.lab, definition)
    on_event(f"run {task}: servers {', '.join(n.name for n in servers) or 'none'} first, then "
             f"{', '.join(n.name for n in finishers)}")
    runs = supervisor.execute()
    out.print(summary(lf, runs))
    if supervisor.problem:
        out.print(Text(f"tflab: {supervisor.problem}", style="bold red"), soft_wrap=True)
    ok = launcher.succeeded(runs) and supervisor.problem is None
    out.print(f"outputs: {folder} (logs in {folder / 'logs'})")
    raise typer.Exit(0 if ok else 1)
