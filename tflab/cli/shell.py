"""Commands that reach into one node: exec (a task or any command) and ssh."""

from __future__ import annotations

import math
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from tflab.cli.common import (
    LabOption,
    StreamOut,
    ViaOption,
    backend,
    check_via,
    err_console,
    open_lab,
)
from tflab.engine.backend import LabBackend
from tflab.engine.executors import ssh_argv
from tflab.errors import Interrupted, UserError
from tflab.host import locks, proc
from tflab.host.signals import stop_signals
from tflab.plan import tasks
from tflab.run.command import CommandRun
from tflab.run import failures, history
from tflab.run.exec_session import ExecResult, ExecSession, ExecSetup
from tflab.run.runplan import exec_plan, run_plan
from tflab.run.words import Verdict


def exec_(
    node: Annotated[str, typer.Argument(help="The node to run on.")],
    command: Annotated[list[str] | None, typer.Argument(help="TASK from tflab.yaml, or -- CMD ...")] = None,
    tty: Annotated[bool | None, typer.Option("--tty/--no-tty", help="Give it a terminal (default: when stdin is one).")] = None,
    grace: Annotated[float | None, typer.Option(help="Stop a worker still waiting this many seconds after the chief's exec finished (without it, tflab only says so, after 30 s).")] = None,
    resume: Annotated[bool, typer.Option(help="Keep the previous session's outputs (resume from its checkpoint) when this exec starts one.")] = False,
    stall: Annotated[float, typer.Option(help="Seconds the node may print no step and compute nothing; then the exec is stalled, and tflab says who runs no exec of the task (0: never).")] = 120.0,
    via: ViaOption = "docker",
    lab: LabOption = Path("."),
) -> None:
    """Run a task as NODE (its servers started first when they are not serving yet), or, after --, any command.

    NODE's exit code is tflab's. The first exec of a task starts a fresh session (as `tflab run`,
    unless --resume); execs of the same task in other terminals join it. Servers are stopped
    when the last exec using them ends.
    """
    if grace is not None and not 0 <= grace < math.inf:  # before anything is asked of the engine
        raise UserError(f"--grace must be 0 or more seconds, not {grace}")
    if not 0 <= stall < math.inf:
        raise UserError(f"--stall must be 0 or more seconds, not {stall}")
    lf = open_lab(lab)
    lf.lab.node(node)
    check_via(via)
    words = list(command or [])
    # Options end at NODE, so click leaves a `--` after it among the arguments.
    dashdash = words[:1] == ["--"]
    if dashdash:
        words = words[1:]
    if words and not dashdash and len(words) > 1:
        raise UserError(f"`tflab exec {node} {shlex.join(words)}`: name one task, or put -- before a command")
    task = lf.config.task(words[0]) if words and not dashdash else None
    side = backend(lf)
    if task is None:
        argv = words or ["bash", "-l"]
        use_tty = sys.stdin.isatty() and sys.stdout.isatty() if tty is None else tty
        sys.exit(_exec_command(side, node, argv, use_tty, via))
    task_lock = locks.try_lock(locks.task_lock_path(lf.state_dir, task.name), shared=True)
    if task_lock is None:
        raise UserError(f"run {task.name} is going (`tflab attach {task.name}` follows it, `tflab stop {task.name}` "
                        "ends it): an exec of the same task would share its servers and its folder")
    other = history.holding(lf.runs_dir, lf.state_dir / "execs", task.name)
    if other is not None:
        task_lock.close()
        raise UserError(other)
    servers = tasks.servers_for_exec(lf.lab, task, node)
    worker = node in run_plan(lf.lab, task).finishers
    setup = ExecSetup(
        task=task.name, node=node, servers=tuple(n.name for n in servers), commands=tasks.commands(lf.lab, task),
        env=tasks.task_env(task.name), lock=lf.state_file(f"exec-{task.name}.lock"),
        records=lf.state_dir / "execs" / task.name, runs_dir=lf.runs_dir,
        plan=exec_plan(lf.lab, task, node, grace, stall_s=stall) if worker else None, resume=resume,
        progress=task.progress,
        host_cpus=len(lf.config.host.cpus) or 1,
    )
    executor = side.executor([node, *setup.servers], via)
    err = err_console()

    def stdout_closed() -> None:  # `tflab exec worker0 train | head`: the exec ends, as the pipe's writer would
        try:
            session.interrupt("its output was closed")
        except Interrupted:
            pass

    output = StreamOut(on_broken=stdout_closed)
    session = ExecSession(executor, setup, output, lambda message: err.print(f"tflab: {message}", markup=False))
    with stop_signals(session.interrupt):
        result = session.run()
    output.finish()
    err.print(f"tflab: {exec_verdict(node, task.name, result)}", markup=False)
    if result.verdict in failures.DIAGNOSED and result.log is not None:  # a known failure's cause and cure
        found = failures.diagnose(failures.last_lines(result.log))
        for line in failures.said({node: found.as_dict()}) if found is not None else []:
            err.print(line, markup=False)
    sys.exit(result.code)


def exec_verdict(node: str, task: str, result: ExecResult) -> str:
    """The exec's last line: its verdict, exit code, length, steps/s, and the problem where there was one."""
    facts = [f"exit {result.code}", f"{result.duration_s:.1f}s"]
    if result.steps_per_s:
        facts.append(f"{result.steps_per_s:.1f} steps/s")
    facts += [f"{metric} {value:g}" for metric, value in result.quality.items()]  # as a run's summary says them
    line = f"{node}'s {task}: {result.verdict} ({', '.join(facts)})"
    return f"{line}: {result.problem}" if result.problem and result.verdict != Verdict.INTERRUPTED else line


SIGPIPE_EXIT = 128 + 13


def _exec_command(side: LabBackend, node: str, argv: list[str], use_tty: bool, via: str) -> int:
    """Any command in a node: on this terminal (`docker exec -it`, `ssh -t`), else attached through the guard."""
    if use_tty:
        return proc.interactive(side.interactive(node, argv, via))
    output = StreamOut(on_broken=lambda: command.output_closed())
    command = CommandRun(side.executor([node], via), node, argv, output)
    # Like `run`, stop the command in the node on Ctrl-C (a bare `docker exec` would leave it running).
    with stop_signals(command.interrupt):
        finish = command.run()
    output.finish()
    if output.broken:
        return SIGPIPE_EXIT  # as a program writing into a closed pipe ends
    if finish.exit_code == 255 and finish.problem:
        err_console().print(f"tflab: {finish.problem}", markup=False)
    return finish.exit_code


def ssh(
    node: Annotated[str, typer.Argument(help="The node to open a shell on.")],
    remote: Annotated[list[str] | None, typer.Argument(help="A command line to run instead of a shell, as ssh runs it (`tflab ssh worker1 'echo $TF_CONFIG; nproc'`).")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Open a shell on NODE over SSH with the lab key, through its published port."""
    lf = open_lab(lab)
    lf.lab.node(node)
    if shutil.which("ssh") is None:
        raise UserError("no ssh client on this host; install openssh-client")
    words = list(remote or [])
    if words[:1] == ["--"]:
        words = words[1:]
    targets = backend(lf).ssh_targets()
    if node not in targets:
        raise UserError(f"node {node} is not running; `tflab up` starts it")
    # One word is a command line for the node's shell, as ssh runs it (`'echo $TF_CONFIG; nproc'` runs both); several
    # keep their quoting (`python -c "print(1, 'a b')"`).
    remote_line: str | list[str] = words[0] if len(words) == 1 else words
    sys.exit(proc.interactive(ssh_argv(targets[node], lf.private_key, [], remote_line)))
