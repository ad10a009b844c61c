"""`tflab run` (in the foreground or detached), and the runs kept: runs, attach, stop."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from dataclasses import replace
from collections.abc import Callable
from pathlib import Path
from typing import IO, Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from tflab_guard import protocol

from tflab.cli import views
from tflab.cli.common import (
    SETTINGS,
    LabOption,
    ViaOption,
    backend,
    check_via,
    console,
    ensure_board,
    err_console,
    keep_line,
    open_lab,
    options_again,
)
from tflab.engine import guardcmd
from tflab.errors import TflabError, UserError
from tflab.host import proc
from tflab.host.fanout import parallel
from tflab.host.labfiles import LabFiles
from tflab.host.signals import stop_signals
from tflab.plan import faults
from tflab.plan import knobs as knob_rules
from tflab.plan.config import check_task_name
from tflab.plan.tensordump import TensorCut
from tflab.run import failures, history, pictures, runreport
from tflab.run.bottleneck import Limit
from tflab.run.request import PreparedRun, RunRequest, execute_run, prepare_run
from tflab.run.runreport import RunReport
from tflab.run.words import Verdict

DETACH_WAIT_S = 240.0

log = logging.getLogger("tflab.run")


class TerminalSink:
    """A run's lines with a coloured `[node]` prefix on the terminal, and in output.log as plain text.

    A line a program redraws (Keras' and tqdm's bars: `\r`, `\b`) shows on a terminal as one line per node, updated
    in place below the output (Rich's Live), until the program ends it; then, as in a pipe and in output.log, it is
    printed once, as its last state. A closed stdout (`tflab run train | head`) stops the run, once; the rest goes
    to stderr.
    """

    def __init__(self, lab_names: list[str], output_log: IO[str], terminal: Console | None) -> None:
        self.colours = {name: views.NODE_COLOURS[i % len(views.NODE_COLOURS)] for i, name in enumerate(lab_names)}
        self.output_log = output_log
        self.terminal = terminal
        self.broken = False
        self.on_broken = lambda: None
        self.tensors: dict[str, TensorCut] = {}  # per node: a traceback's pages of tensor values, cut to its message
        self.bars: dict[str, Text] = {}  # per node: its line being redrawn (a progress bar), shown live
        self.live: Live | None = None

    def update(self, node: str, text: str) -> None:
        if self.terminal is None or self.broken or not self.terminal.is_terminal:
            return  # piped: the bar's state when its line ends
        self.bars[node] = self._prefix(node) + Text(text.strip("\n"))
        self._refresh()

    def _prefix(self, node: str) -> Text:
        return Text(f"[{node}] ", style=f"bold {self.colours.get(node, 'white')}")

    def _refresh(self) -> None:
        assert self.terminal is not None
        if not self.bars:
            if self.live is not None:
                self.live.stop()
                self.live = None
            return
        shown = Group(*self.bars.values())
        if self.live is None:
            self.live = Live(shown, console=self.terminal, auto_refresh=False, transient=True)
            self.live.start()
        self.live.update(shown, refresh=True)

    def close(self) -> None:
        """The live bars gone (the run has ended)."""
        self.bars.clear()
        if self.terminal is not None:
            self._refresh()

    def line(self, node: str, text: str) -> None:
        if node in self.bars:  # its bar's line has ended: printed below as it ended
            del self.bars[node]
            self._refresh()
        if not keep_line(text):
            return
        self.output_log.write(f"[{node}] {text}\n")
        self.output_log.flush()
        for shown in self.tensors.setdefault(node, TensorCut()).show(text):
            self._show(Text(f"[{node}] ", style=f"bold {self.colours.get(node, 'white')}") + Text(shown))

    def event(self, message: str) -> None:
        self.output_log.write(f"tflab: {message}\n")
        self.output_log.flush()
        self._show(Text(f"tflab: {message}", style="bold"))

    def _show(self, text: Text) -> None:
        if self.terminal is None or self.broken:
            return
        try:
            self.terminal.print(text, soft_wrap=True)
        except BrokenPipeError:  # the console pointed stdout at /dev/null already
            self.broken = True
            self.on_broken()


def terminal_sinks(lf: LabFiles, terminal: Console | None, prepared: PreparedRun) -> Callable[[IO[str]], TerminalSink]:
    """What makes a run's sink: its lines on `terminal` (none: output.log only); a closed stdout interrupts it."""
    def make(output_log: IO[str]) -> TerminalSink:
        sink = TerminalSink(lf.lab.names, output_log, terminal)
        sink.on_broken = lambda: prepared.interrupt("the output pipe closed")
        return sink
    return make


WorkersOption = Annotated[str | None, typer.Option(
    "--workers", help="This run's cluster: the servers plus the first K workers (the others stay idle).")]
LinkRateOption = Annotated[str | None, typer.Option(
    "--link-rate", help="Every node's link for this run (100mbit, 1gbit; none: unshaped), restored after it.")]
CpusOption = Annotated[list[str] | None, typer.Option(
    "--cpus", help="CPUs each node of this run may use (0.5), or NODE=SHARE (repeatable); restored after it.")]
EnvOption = Annotated[list[str] | None, typer.Option(
    "--env", help="NAME=VALUE in every process's environment, and {NAME} in the task's command (repeatable).")]


def run(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="A task of tflab.yaml.")],
    grace: Annotated[float, typer.Option(help="Seconds a worker may stay silent after the chief finished before it counts as hung.")] = 30.0,
    timeout: Annotated[float | None, typer.Option(help="Seconds the whole run may take.")] = None,
    stall: Annotated[float, typer.Option(help="Seconds the workers may print no step while no node prints or computes; then the run is stalled, and tflab says who never joined (0: never).")] = 120.0,
    restarts: Annotated[int, typer.Option(help="Restarts allowed for each failed non-chief worker.")] = 0,
    resume: Annotated[bool, typer.Option(help="Keep the previous run's outputs (resume from its checkpoint).")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Return once the servers serve and the workers started; the run goes on without the terminal.")] = False,
    metrics: Annotated[bool, typer.Option(help="Write each node's CPU, memory, network, GPUs and steps/s for TensorBoard (runs/TASK/cluster/).")] = True,
    fault: Annotated[list[str] | None, typer.Option("--fault", help='A drill: "kill worker1 at step 300 then restart", "pause worker2 at 30s for 15s", "cut ps0 at step 100 for 10s" (repeatable).')] = None,
    expect: Annotated[str | None, typer.Option(help="What the drill should do to the training: survive (exit 0 when it finished despite the faults) or fail.")] = None,
    workers: WorkersOption = None,
    link_rate: LinkRateOption = None,
    cpus: CpusOption = None,
    env: EnvOption = None,
    via: ViaOption = "docker",
    lab: LabOption = Path("."),
    detached_child: Annotated[bool, typer.Option("--detached-child", hidden=True)] = False,
) -> None:
    """Run TASK on every node: servers first (waited on), then workers; exit 0 only if every worker succeeds."""
    if restarts < 0:
        raise UserError("--restarts cannot be negative")
    if not 0 <= grace < math.inf or (timeout is not None and not 0 < timeout < math.inf):
        raise UserError("--grace must be 0 or more and --timeout more than 0 seconds (finite numbers)")
    if not 0 <= stall < math.inf:
        raise UserError(f"--stall {stall:g} must be 0 (never) or a number of seconds")
    lf = open_lab(lab)
    definition = lf.config.task(task)
    check_via(via)
    knobs = knob_rules.parse(lf.lab, len(lf.config.host.cpus), workers, link_rate, cpus or (), env or ())
    drill = tuple(faults.parse(spec, lf.lab.names) for spec in fault or ())
    request = RunRequest(definition, knobs, grace_s=grace, timeout_s=timeout, restarts=restarts, resume=resume,
                         metrics=metrics, drill=drill, expect=faults.check_expectation(expect, drill), via=via,
                         stall_s=stall)
    prepared = prepare_run(lf, request, lambda: backend(lf))
    if not detached_child:  # every run names the lab's one TensorBoard (started where none serves), after its plan
        try:
            prepared.board = ensure_board(lf, prepared.side)
        except TflabError as exc:
            log.debug("no TensorBoard for this run: %s", exc)
    if detach and not detached_child:
        if prepared.board:
            console().print(prepared.board, markup=False, soft_wrap=True)
        prepared.lock.close()  # the run's own process takes it
        _detach(lf, task, options_again(ctx, leave_out={"detach", "detached_child", "lab"}))
        return
    terminal = None if detached_child else console()
    with stop_signals(lambda reason, force: prepared.interrupt(reason, force)):
        result, report, session = execute_run(lf, prepared, terminal_sinks(lf, terminal, prepared),
                                            detached=detached_child)
    if isinstance(session.sink, TerminalSink):
        session.sink.close()
    out = err_console() if getattr(session.sink, "broken", False) or terminal is None else console()
    show_verdict(out, lf, report, session.folder)
    raise typer.Exit(result.finish.exit_code)


def show_verdict(out: Console, lf: LabFiles, report: RunReport, folder: Path) -> None:
    """The summary table, the problem if any, and where the outputs are."""
    out.print(views.run_summary(lf.lab, report.nodes))
    if report.steps_per_s and report.steps_are_global:
        out.print(f"cluster: {report.steps_per_s:.1f} steps/s (the global step's rate; a node's own rate is its own "
                  "steps', `(global)` where it shows only the global step)", soft_wrap=True)
    if report.knobs:
        out.print(f"knobs: {knob_rules.describe(report.knobs)}", soft_wrap=True)
    if report.faults:
        out.print(views.drill_table(report.faults))
    if report.quality:
        out.print(f"quality: {views.quality_text(report)} (as the chief last printed it; run.json keeps the series)",
                  soft_wrap=True)
    if report.problem:
        out.print(Text(f"tflab: {report.problem}", style="bold red"), soft_wrap=True)
    for line in failures.said({name: row.diagnosis for name, row in report.nodes.items() if row.diagnosis}):
        out.print(Text(line, style="bold"), soft_wrap=True)
    for row in report.nodes.values():
        if row.waits:
            out.print(Text(f"where: {row.waits}"), soft_wrap=True)
    if report.note:
        out.print(Text(f"tflab: note: {report.note}", style="yellow"), soft_wrap=True)
    limit = report.limit or {}
    if limit.get("kind") and limit.get("evidence"):
        out.print(Text(f"tflab: {Limit(str(limit['kind']), str(limit['evidence'])).sentence()}",
                       style="yellow" if limit["kind"] == "host" else "cyan"), soft_wrap=True)
    out.print(f"outputs: {folder} (logs in {folder / history.LOG_DIR})", soft_wrap=True)
    if (folder / pictures.TRACE).is_file():
        out.print(f"report: {folder / pictures.REPORT} (drawn a moment after; timeline.png and trace.json beside it)",
                  soft_wrap=True, markup=False)


def _detach(lf: LabFiles, task: str, options: list[str]) -> None:
    """Start the run in a process of its own session and return once its workers started."""
    argv = [sys.executable, "-m", "tflab", *(["-v"] if SETTINGS.verbose else []), "run", task,
            "--lab", str(lf.root), *options, "--detached-child"]
    log_path = lf.state_file(f"detached-{task}.log")
    with log_path.open("w") as log:
        child = proc.start(argv, stdin=proc.DEVNULL, stdout=log, stderr=proc.STDOUT, new_session=True, cwd=lf.root)
    report = wait_until_started(child, lf.runs_dir / task, log_path, task)
    out = console()
    if report.finished:
        show_verdict(out, lf, report, lf.runs_dir / task)
        raise typer.Exit(report.exit_code or 0)
    out.print(f"tflab: run {task} goes on in the background (pid {child.pid}): `tflab attach {task}` follows it, "
              f"`tflab stop {task}` ends it, `tflab runs` lists runs", soft_wrap=True)


def wait_until_started(child, folder: Path, log_path: Path, task: str, wait_s: float = DETACH_WAIT_S,
                       clock: Callable[[], float] = time.monotonic, pause_s: float = 0.1) -> RunReport:
    """run.json of a detached run once its workers run (or it finished); an error as soon as its process is gone."""
    deadline = clock() + wait_s
    while clock() < deadline:
        report = runreport.load(folder)
        if report is not None and report.pid == child.pid and report.state in ("running", "stopping", "finished"):
            return report
        if child.poll() is not None:
            report = runreport.load(folder)
            if report is not None and report.pid == child.pid and report.finished:
                return report
            tail = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
            said = tail[-1] if tail else f"it exited with {child.returncode} and said nothing"
            raise UserError(f"the detached run of {task} ended before its workers started: {said}")
        time.sleep(pause_s)
    raise UserError(f"the detached run of {task} did not get its workers going within {wait_s:g}s; "
                    f"see {log_path} and `tflab attach {task}`")


EXECS_SHOWN = 20  # the latest execs `runs` lists (their records stay)


def runs(lab: LabOption = Path(".")) -> None:
    """The lab's runs, going and finished: task, start, duration, verdict, result, steps/s."""
    lf = open_lab(lab)
    found = history.all_runs(lf.runs_dir)
    skipped = history.unreadable(lf.runs_dir)
    execs = history.all_execs(lf.state_dir / "execs")
    if not found and not execs:
        console().print(f"no runs yet in {lf.runs_dir} (`tflab run TASK` makes one)")
    if found:
        console().print(views.runs_table(found))
    if execs:
        shown = execs[-EXECS_SHOWN:]
        console().print(views.execs_table(shown))
        if len(execs) > len(shown):
            console().print(f"{len(execs) - len(shown)} earlier execs left out")
    if skipped:
        console().print(f"left out: {', '.join(p.name for p in skipped)} (their {runreport.RUN_FILE} is not one "
                        "tflab wrote)")


def _current(lf: LabFiles, task: str) -> tuple[Path, RunReport]:
    check_task_name(task)
    folder = lf.runs_dir / task
    report = runreport.load(folder)
    if report is None:
        raise UserError(f"no run of {task} in {lf.runs_dir}; `tflab runs` lists the runs")
    return folder, report


def attach(
    task: Annotated[str, typer.Argument(help="The task whose run to follow.")],
    lab: LabOption = Path("."),
) -> None:
    """Follow a run's output to its verdict (Ctrl-C detaches and stops nothing)."""
    lf = open_lab(lab)
    folder, report = _current(lf, task)
    out = console()
    position = 0
    detached = [False]
    if report.finished:  # nothing to follow: say that what comes is a replay, not a run going now
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.ended)) if report.ended else "earlier"
        err_console().print(f"tflab: run {task} ended {when} ({report.verdict or 'no verdict'}); its output as it "
                            "was:", markup=False)

    def on_stop(_reason: str, _force: bool) -> None:
        detached[0] = True

    with stop_signals(on_stop):
        while not detached[0]:
            try:
                with (folder / history.OUTPUT_FILE).open("rb") as handle:
                    handle.seek(position)
                    chunk = handle.read()
            except OSError:
                chunk = b""
            if chunk:
                complete = chunk[: chunk.rfind(b"\n") + 1]
                position += len(complete)
                if complete:
                    sys.stdout.write(complete.decode(errors="replace"))
                    sys.stdout.flush()
            report = runreport.load(folder) or report
            if report.finished and not chunk:
                break
            if not report.finished and not report.is_live():
                err_console().print(f"tflab: the run's supervisor (pid {report.pid}) is gone; "
                                    f"`tflab stop {task}` clears what it left")
                raise typer.Exit(1)
            time.sleep(0.2)
    if detached[0]:
        err_console().print(f"tflab: detached from run {task}; it goes on (`tflab stop {task}` ends it)")
        return
    show_verdict(out, lf, report, folder)
    raise typer.Exit(report.exit_code or 0)


def stop(
    task: Annotated[str, typer.Argument(help="The task whose run to stop.")],
    via: ViaOption = "docker",
    lab: LabOption = Path("."),
) -> None:
    """Stop a running run: every process it started ends, and it gets its verdict."""
    lf = open_lab(lab)
    folder, report = _current(lf, task)
    check_via(via)
    if report.finished:
        console().print(f"run {task} has already finished: {report.verdict}")
        return
    if report.is_live() and report.pid is not None:
        os.kill(report.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            report = runreport.load(folder) or report
            if report.finished:
                show_verdict(console(), lf, report, folder)
                return
            time.sleep(0.2)
        raise UserError(f"run {task} (pid {report.pid}) did not stop within 60s")
    # Its supervisor is gone: clear whatever it left in the nodes, and say so in its record.
    side = backend(lf)
    running = [name for name, node in side.status().items() if node.running and name in lf.lab.names]
    executor = side.executor(running, via)
    parallel(lambda name: executor.run(name, guardcmd.stop([protocol.run_key(task, "*")], force=True)), running)
    report = replace(report, state="finished", verdict=Verdict.INTERRUPTED, exit_code=130, ended=time.time(),
                     problem=f"its supervisor (pid {report.pid}) was gone; `tflab stop` cleared what it left")
    report.save(folder)
    show_verdict(console(), lf, report, folder)
