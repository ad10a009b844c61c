"""`tflab sweep` (a grid of run-time knobs, each point a normal run) and `tflab sweeps`."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from tflab.cli import views
from tflab.cli.common import LabOption, ViaOption, backend, check_via, console, err_console, open_lab
from tflab.cli.runs import terminal_sinks
from tflab.errors import UserError
from tflab.host.fanout import background
from tflab.host.labfiles import LabFiles
from tflab.host.signals import stop_signals
from tflab.plan import quality
from tflab.run import history, sweep, sweep_report
from tflab.run.costmodel import ALLREDUCE, PS
from tflab.run.request import RunRequest, execute_run, prepare_run
from tflab.run.runreport import RunReport
from tflab.run.words import Verdict


def sweep_cmd(
    task: Annotated[str | None, typer.Argument(help="A task of tflab.yaml (or --vary task=A,B).")] = None,
    vary: Annotated[list[str] | None, typer.Option("--vary", help="AXIS=V1,V2,...: workers, link-rate (none: unshaped), cpus, task, env.NAME (repeatable).")] = None,
    repeats: Annotated[int, typer.Option(help="Runs of each point.")] = 1,
    name: Annotated[str | None, typer.Option(help="The sweep's name (its folder under runs/sweeps/).")] = None,
    predict: Annotated[list[str] | None, typer.Option("--predict", help="workers=8,16: throughput the cost model predicts beyond the grid.")] = None,
    holdout: Annotated[list[str] | None, typer.Option("--holdout", help="workers=2: run those points but fit the model without them; the report says its error there (with --resume, `none` fits every point again).")] = None,
    target: Annotated[str | None, typer.Option(help="METRIC=VALUE (accuracy=0.95, loss=0.1): each point's time to reach it, as the chief printed it.")] = None,
    resume: Annotated[str | None, typer.Option(help="Run the missing points of the sweep NAME.")] = None,
    grace: Annotated[float, typer.Option(help="Each run's grace for a silent worker after the chief finished.")] = 30.0,
    timeout: Annotated[float | None, typer.Option(help="Seconds each run may take.")] = None,
    via: ViaOption = "docker",
    lab: LabOption = Path("."),
) -> None:
    """Run TASK at every point of a grid of knobs on the running lab, one after another; write what they show."""
    lf = open_lab(lab)
    check_via(via)
    if resume is not None:
        if task is not None or vary or predict or name or target:
            raise UserError("--resume NAME runs a sweep's missing points as it was made: give no task, --vary, "
                            "--predict, --target or --name with it (--holdout looks at it again: its model fitted "
                            "without those points)")
        spec = sweep.load_spec(lf.runs_dir, resume)
        if holdout:
            spec = replace(spec, holdout={} if holdout == ["none"] else sweep.parse_predict(holdout, spec.axes,
                                                                                            "--holdout"))
            sweep.save_spec(sweep.folder_of(lf.runs_dir, spec.name), spec)
    else:
        axes = sweep.parse_vary(vary or ())
        try:
            goal = quality.parse_target(target) if target is not None else None
        except ValueError as exc:
            raise UserError(f"--target {exc}") from None
        spec = sweep.SweepSpec(name or sweep.default_name(task), task, axes, repeats,
                               sweep.parse_predict(predict or (), axes), goal,
                               sweep.parse_predict(holdout or (), axes, "--holdout"))
        if sweep.folder_of(lf.runs_dir, spec.name).exists():
            raise UserError(f"a sweep {spec.name!r} exists already; `tflab sweep --resume {spec.name}` runs its "
                            "missing points, or give another --name")
    sweep.check(spec, lf.config, lf.lab)
    folder = sweep.folder_of(lf.runs_dir, spec.name)
    rows = sweep.load_rows(folder)
    todo = sweep.missing(spec, rows)
    total = len(spec.points())
    out = console()
    if not todo:
        out.print(f"sweep {spec.name}: every point has run; its report is {folder / sweep_report.REPORT}")
        _write_findings(lf, folder, spec, rows)
        return
    sweep.save_spec(folder, spec)
    out.print(f"sweep {spec.name}: {len(todo)} of {total} points to run, one after another, on lab "
              f"'{lf.config.name}'; outputs in {folder}", soft_wrap=True)
    stopped = [False]
    current: list = [None]

    def on_stop(reason: str, force: bool) -> None:
        stopped[0] = True
        if current[0] is not None:
            current[0].interrupt(reason, force)

    nodes = lf.lab.names
    background(sweep_report.prepare, name="sweep-imports")  # beside the first point: the end waits on no import
    with stop_signals(on_stop), Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                         TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                         console=out, transient=True) as bar:
        progress_id = bar.add_task(f"sweep {spec.name}", total=total, completed=total - len(todo))
        for point in todo:
            if stopped[0]:
                break
            definition = lf.config.task(sweep.point_task(spec, point))
            knobs = sweep.point_knobs(point, lf.lab, len(lf.config.host.cpus))
            bar.update(progress_id, description=f"point {point.number}/{total}: {point.describe()}"
                                                f"{f' (repeat {point.repeat})' if spec.repeats > 1 else ''}")
            request = RunRequest(definition, knobs, grace_s=grace, timeout_s=timeout, via=via)
            try:
                prepared = prepare_run(lf, request, lambda: backend(lf))
            except UserError as exc:
                bar.stop()
                raise UserError(f"point {point.number} ({point.describe()}): {exc}") from None
            current[0] = prepared
            if stopped[0]:
                prepared.lock.close()
                break
            _result, report, session = execute_run(lf, prepared, terminal_sinks(lf, None, prepared))
            current[0] = None
            if stopped[0] and report.verdict == Verdict.INTERRUPTED:
                break  # what the Ctrl-C cut short is no result: --resume runs it again
            kept = _keep_run(lf, folder, point, session.folder)
            rows = [r for r in rows if r["point"] != point.key]
            rows.append(sweep.row(spec, point, report, kept, sweep.batch_of(definition.batch, knobs, lf.lab), nodes,
                                  sweep.cpu_shares(lf.lab, knobs, len(lf.config.host.cpus))))
            sweep.save_rows(folder, spec, rows, nodes)
            bar.update(progress_id, advance=1)
            out.print(_point_line(point, total, report, spec.target), soft_wrap=True)
    found = _write_findings(lf, folder, spec, rows)
    left = sweep.missing(spec, rows)
    out.print(_table(spec, rows))
    for group in found["predicted"]:
        fitted = group["fit"]
        error = f"{fitted.error:.0%}" if fitted.error is not None else "not measurable"
        shown = ", ".join(f"{p['design']}: {p['value']:.4g} {group['unit']} ({p['dominant']})"
                          for p in group["predicted"])
        if shown:
            out.print(f"predicted by the cost model ({fitted.strategy}; {group['group']}): {shown}; its "
                      f"leave-one-out error on the measured points: {error}", soft_wrap=True)
    out.print(f"report: {folder / sweep_report.REPORT}; plots: "
              f"{', '.join(p.name for p in found['plots']) or 'none (no numeric axis with two values)'}; "
              f"`tflab tensorboard` shows its HParams", soft_wrap=True)
    if left:
        err_console().print(f"tflab: sweep {spec.name} stopped with {len(left)} of {total} points missing; "
                            f"`tflab sweep --resume {spec.name}` runs them", soft_wrap=True)
        raise typer.Exit(130 if stopped[0] else 1)
    if any(r.get("verdict") != "ok" for r in rows):
        raise typer.Exit(1)


def _keep_run(lf: LabFiles, folder: Path, point: sweep.Point, run_folder: Path) -> str:
    """Move a point's run folder under the sweep (the next point's run would move it aside): its path there."""
    target = folder / sweep.POINT_RUNS / point.key
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        run_folder.rename(target)
    except OSError:
        return str(run_folder)
    return str(target.relative_to(folder))


def _point_line(point: sweep.Point, total: int, report: RunReport, spec_target: tuple[str, float] | None) -> Text:
    rate = report.steady_steps_per_s or report.steps_per_s
    limit = (report.limit or {}).get("kind")
    verdict = report.verdict or "-"
    text = Text(f"point {point.number}/{total} ({point.describe()}, repeat {point.repeat}): ")
    text.append(verdict, style=views.verdict_colour(verdict))
    text.append(f", {rate:.2f} steps/s" if rate else ", no steps seen")
    for metric, value in (report.quality or {}).items():
        text.append(f", {metric} {value:.4g}")
    if spec_target is not None:
        metric, goal = spec_target
        reached = quality.time_to((report.quality_series or {}).get(metric) or [], metric, goal)
        text.append(f", {metric} {goal:g} after {reached:.1f}s" if reached is not None
                    else f", never reached {metric} {goal:g}")
    if limit:
        text.append(f", limited by {limit}")
    return text


def _table(spec: sweep.SweepSpec, rows: list[dict]) -> Table:
    table = Table(title=f"sweep {spec.name}")
    axes = [a.name for a in spec.axes]
    metrics = [m for m in sweep.QUALITY_COLUMNS if any(r.get(m) is not None for r in rows)]
    target = ([f"{spec.target[0]} {spec.target[1]:g} after"] if spec.target else [])
    for column in (*axes, "repeat", "verdict", "steps/s", "examples/s", *metrics, *target, "limit"):
        table.add_column(column)
    for r in rows:
        reached = ([("never" if r.get(sweep.TARGET_COLUMN) is None else f"{r[sweep.TARGET_COLUMN]:.1f}s")]
                   if spec.target else [])
        table.add_row(*(str(r.get(a)) for a in axes), str(r.get("repeat")), str(r.get("verdict")),
                      f"{r['steps_per_s']:.2f}" if r.get("steps_per_s") else "-",
                      f"{r['examples_per_s']:.0f}" if r.get("examples_per_s") else "-",
                      *(f"{r[m]:.4g}" if r.get(m) is not None else "-" for m in metrics), *reached,
                      str(r.get("limit") or "-").split(":", 1)[0])
    return table


def _write_findings(lf: LabFiles, folder: Path, spec: sweep.SweepSpec, rows: list[dict]) -> dict:
    tasks = [spec.task] if spec.task else list(next(a.values for a in spec.axes if a.name == "task"))
    with_ps = lf.lab.topology.ps_count > 0 and all("ps" in lf.config.task(t).servers for t in tasks)
    per_worker = all((lf.config.task(t).batch or "").endswith(sweep.PER_WORKER) for t in tasks)
    return sweep_report.write_all(folder, spec, rows, PS if with_ps else ALLREDUCE, lf.config.links.rate,
                                  sweep.missing(spec, rows), per_worker)


def sweeps(lab: LabOption = Path(".")) -> None:
    """The lab's sweeps: name, task, axes, points run of all, and where their reports are."""
    lf = open_lab(lab)
    found = sweep.all_sweeps(lf.runs_dir)
    if not found:
        console().print(f"no sweeps yet in {lf.runs_dir / sweep.SWEEPS_DIR} (`tflab sweep TASK --vary ...` makes one)")
        return
    table = Table()
    for column in ("sweep", "task", "axes", "points", "failed", "last run"):
        table.add_column(column)
    for spec, rows in found:
        total = len(spec.points())
        failed = sum(1 for r in rows if r.get("verdict") != "ok")
        folder = sweep.folder_of(lf.runs_dir, spec.name) / sweep.RESULTS_JSON
        when = history.stamp(folder.stat().st_mtime) if folder.exists() else "-"
        table.add_row(spec.name, spec.task or "(task axis)",
                      "; ".join(f"{a.name}={','.join(a.values)}" for a in spec.axes),
                      f"{len(rows)}/{total}", str(failed), when)
    console().print(table)

