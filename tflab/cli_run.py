"""`tflab run`: one task across the lab, in order, to a verdict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tflab import doctor as doctor_checks
from tflab import engine, lab as lab_ops, labfiles, launcher, nodes, tasks, views
from tflab.cli import LabOption, app, console
from tflab.errors import UserError


def fresh_run_dir(lf: labfiles.LabFiles, task: str, resume: bool) -> Path:
    """The host side of /runs/TASK: a previous run's is moved aside unless resuming."""
    folder = lf.runs_dir / task
    if folder.exists() and not resume:
        folder.rename(lf.runs_dir / f"{task}.{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def summary(lf: labfiles.LabFiles, runs: list[launcher.NodeRun]) -> Table:
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
    lf = labfiles.open_lab(lab)
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


TENSORBOARD_RUN_ID = "tensorboard"


@app.command()
def tensorboard(
    stop: Annotated[bool, typer.Option("--stop", help="Stop the TensorBoard tflab started.")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Serve the shared runs folder with TensorBoard inside the chief node, published on the host."""
    lf = labfiles.open_lab(lab)
    client = engine.client()
    chief = lf.lab.chief
    container = nodes.running_container(client, lf.project, chief.name)
    nodes.exec_quiet(client, container, launcher.stop_script(TENSORBOARD_RUN_ID, chief.name, 2.0))
    if stop:
        console().print(f"stopped TensorBoard on {chief.name}")
        return
    argv = ["tensorboard", "--logdir", "/runs", "--host", "0.0.0.0", "--port", "6006", "--reload_interval", "5"]
    nodes.exec_detached(client, container, launcher.wrapped(TENSORBOARD_RUN_ID, chief.name, argv))
    host = lab_ops.connect_host(lf.lab.topology.bind)
    url = f"http://{host}:{chief.tensorboard_port}/"
    if not nodes.wait_for_http(url, deadline=time.monotonic() + 90):
        raise UserError(f"TensorBoard did not answer at {url} within 90s; see `tflab exec {chief.name} -- tensorboard --help`")
    console().print(f"TensorBoard for {lf.runs_dir} (as /runs in {chief.name}): {url}")


@app.command()
def doctor() -> None:
    """Check the engine, compose v2, GPUs, the NVIDIA runtime, disk and ports; say how to fix what is missing."""
    checks = doctor_checks.run_checks()
    table = Table(title="tflab doctor")
    for column in ("check", "", "detail", "fix"):
        table.add_column(column)
    marks = {"ok": Text("ok", style="green"), "warn": Text("note", style="yellow"), "fail": Text("MISSING", style="bold red")}
    for check in checks:
        table.add_row(check.name, marks[check.status], check.detail, check.fix)
    console().print(table)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        for check in failed:
            console().print(f"missing: {check.name}: {check.detail}; fix: {check.fix}", soft_wrap=True)
        raise typer.Exit(1)
    console().print("ready for CPU labs" + ("" if any(c.name == "GPUs" and c.status == "ok" for c in checks) else " (no GPU here)"))
