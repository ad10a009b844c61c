"""One run as asked for (`tflab run`, a point of `tflab sweep`), checked against the lab, then run to its verdict.

`prepare_run` checks everything that can be checked before a process starts and takes the task's
lock (a one-line error, nothing changed, otherwise); `execute_run` sets the run's knobs, runs it
and restores them however it ends. Where the output goes is the caller's (a `Sink`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from tflab.engine import run_knobs
from tflab.engine.backend import LabBackend
from tflab.engine.faults import FaultInjector
from tflab.engine.run_knobs import KnobSetter
from tflab.errors import UserError
from tflab.host import locks
from tflab.host.labfiles import LabFiles
from tflab.plan import faults
from tflab.plan import knobs as knob_rules
from tflab.plan.config import Task
from tflab.plan.knobs import Knobs
from tflab.run import history, runreport
from tflab.run.launcher import RunResult, Sink
from tflab.run.runplan import RunPlan, run_plan
from tflab.run.runreport import RunReport
from tflab.run.task_run import RunOptions, TaskRun


@dataclass(frozen=True)
class RunRequest:
    """One run as asked for: the task, its knobs, and the rules its verdict follows."""

    definition: Task
    knobs: Knobs = Knobs()
    grace_s: float = 30.0
    timeout_s: float | None = None
    restarts: int = 0
    resume: bool = False
    metrics: bool = True
    drill: tuple[faults.Fault, ...] = ()
    expect: str | None = None
    via: str = "docker"
    stall_s: float = 120.0  # a run in which nothing prints or computes this long is stalled (0: never)


@dataclass
class PreparedRun:
    """A run checked and ready to start: its plan, its task lock, the engine side and what sets its knobs.

    An interrupt that comes before the run started is kept and handed to it when it starts.
    """

    request: RunRequest
    plan: RunPlan
    lock: IO[str]
    side: LabBackend
    doer: FaultInjector | None
    knob_setter: KnobSetter | None
    session: TaskRun | None = None
    interrupted: tuple[str, bool] | None = None
    board: str | None = None  # the lab's TensorBoard in words, said right after the run's plan

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        if self.session is not None:
            self.session.interrupt(reason, force)
        else:
            self.interrupted = (reason, force)


def prepare_run(lf: LabFiles, request: RunRequest, open_side: Callable[[], LabBackend]) -> PreparedRun:
    """Check a run against the lab and take its task's lock: a one-line error, and nothing changed, otherwise.
    `open_side` opens the lab's engine side, once what needs no engine is checked."""
    definition = request.definition
    run_lab = knob_rules.run_lab(lf.lab, request.knobs)
    plan = run_plan(run_lab, definition, grace_s=request.grace_s, timeout_s=request.timeout_s,
                    restarts=request.restarts, faults=request.drill, expect=request.expect, stall_s=request.stall_s)
    if not plan.finishers:
        raise UserError(f"task {definition.name}: every node only serves ({', '.join(definition.servers)}); "
                        "nothing would end the run. Make the lab with --chief, or list fewer servers")
    for planned in request.drill:
        if planned.node not in run_lab.names:
            raise UserError(f"--fault {planned.describe()}: {planned.node} is not in this run's cluster "
                            f"({', '.join(run_lab.names)})")
    run_knobs.check_lab(lf, request.knobs)
    side = open_side()
    doer = FaultInjector.for_lab(lf, side) if request.drill or request.knobs.changes_engine else None
    setter = KnobSetter(doer) if doer is not None and request.knobs.changes_engine else None
    if setter is not None:
        setter.check(request.knobs, definition.name)
    for planned in request.drill:
        assert doer is not None
        doer.check(planned)
    lock = locks.try_lock(locks.task_lock_path(lf.state_dir, definition.name))
    if lock is None:
        raise UserError(task_in_use(lf, definition.name))
    other = history.holding(lf.runs_dir, lf.state_dir / "execs", definition.name)
    if other is not None:
        lock.close()
        raise UserError(other)
    return PreparedRun(request, plan, lock, side, doer if request.drill else None, setter)


def execute_run(lf: LabFiles, prepared: PreparedRun, make_sink: Callable[[IO[str]], Sink],
                detached: bool = False) -> tuple[RunResult, RunReport, TaskRun]:
    """Run a prepared run to its verdict: its knobs set first and restored after, however it ends.
    `make_sink` makes where its output goes, given the run's output.log."""
    request = prepared.request
    definition = request.definition

    executor = prepared.side.executor(lf.lab.names, request.via)
    try:
        session = TaskRun(lf, executor, definition, prepared.plan,
                          RunOptions(resume=request.resume, detached=detached, metrics=request.metrics,
                                     knobs=request.knobs), make_sink, injector=prepared.doer)
        prepared.session = session
        sink = session.sink
        plan = prepared.plan
        servers = plan.servers + plan.sidecars
        sink.event(f"run {definition.name}: servers {', '.join(servers)} first, then {', '.join(plan.finishers)}"
                   if servers else f"run {definition.name}: {', '.join(plan.finishers)} (no servers)")
        if prepared.board:
            sink.event(prepared.board)
        if request.knobs:
            sink.event(f"this run's knobs: {request.knobs.describe()}")
        setter = prepared.knob_setter

        def set_knobs() -> None:
            if setter is not None:
                setter.apply(request.knobs, definition.name, list(plan.servers + plan.sidecars + plan.finishers))
            if prepared.interrupted is not None:
                session.interrupt(*prepared.interrupted)

        def restore_knobs() -> None:
            if setter is not None:
                for said in setter.restore():
                    sink.event(f"restored: {said}")

        result, report = session.execute(on_start=set_knobs, on_end=restore_knobs)
        return result, report, session
    finally:
        prepared.lock.close()


def task_in_use(lf: LabFiles, task: str) -> str:
    """Why a task cannot be run now: a run of it is going, or execs of it are."""
    report = runreport.load(lf.runs_dir / task)
    if report is not None and report.is_live():
        return (f"run {task} is already going (pid {report.pid}); `tflab attach {task}` follows it, "
                f"`tflab stop {task}` ends it")
    return (f"task {task} is in use: a run of it is starting, or `tflab exec NODE {task}` runs in another "
            "terminal; wait until it ends (or stop it) before `tflab run " + task + "`")
