"""Commands that reach into one node: exec (a task or any command) and ssh."""

from __future__ import annotations

import os
import queue
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from tflab import engine, guard, tasks
from tflab.cli.common import LabOption, StreamOut, ViaOption, backend, check_via, err_console, open_lab
from tflab.errors import UserError
from tflab.execsession import ExecSession, ExecSetup
from tflab.signals import stop_signals


def exec_(
    node: Annotated[str, typer.Argument(help="The node to run on.")],
    command: Annotated[list[str] | None, typer.Argument(help="TASK from tflab.yaml, or -- CMD ...")] = None,
    tty: Annotated[bool | None, typer.Option("--tty/--no-tty", help="Give it a terminal (default: when stdin is one).")] = None,
    via: ViaOption = "docker",
    lab: LabOption = Path("."),
) -> None:
    """Run a task as NODE (its servers started first when they are not serving yet), or, after --, any command.

    NODE's exit code is tflab's. Servers this exec started are stopped when it ends, unless
    another `tflab exec` of the same task (say, in a second terminal) still uses them.
    """
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
    side = backend(lf, engine.client())
    if task is None:
        argv = words or ["bash", "-l"]
        use_tty = sys.stdin.isatty() and sys.stdout.isatty() if tty is None else tty
        sys.exit(_exec_command(side, node, argv, use_tty, via))
    servers = tasks.servers_for_exec(lf.lab, task, node)
    setup = ExecSetup(
        task=task.name, node=node, servers=tuple(n.name for n in servers), commands=tasks.commands(lf.lab, task),
        env=tasks.task_env(task.name), lock=lf.state_dir / f"exec-{task.name}.lock",
        warm=lf.config.warm and task.preload,
    )
    executor = side.executor([node, *setup.servers], via)
    output = StreamOut()
    err = err_console()
    session = ExecSession(executor, setup, output, lambda message: err.print(f"tflab: {message}", markup=False))
    with stop_signals(session.interrupt):
        code = session.run()
    output.finish()
    sys.exit(code)


def _exec_command(side, node: str, argv: list[str], use_tty: bool, via: str) -> int:
    """Any command in a node: interactive through `docker exec -it`, else attached through the guard."""
    if use_tty:
        if via == "ssh":
            return subprocess.call(ssh_argv(side.ssh_targets()[node], side.lf.private_key, ["-t"], argv))
        container = side.require_running([node])[node]
        return subprocess.call(["docker", "exec", "-it", "-w", "/workspace", container.id, *argv])
    executor = side.executor([node], via)
    key = guard.exec_key("cmd", node, str(os.getpid()))
    output = StreamOut()
    events: queue.SimpleQueue = queue.SimpleQueue()
    process = executor.start(node, guard.run_argv(key, argv), output,
                             lambda code, reason: events.put(("exit", code, reason)))
    # Like `run`, stop the command in the node on Ctrl-C (a bare `docker exec` would leave it running).
    with stop_signals(lambda reason, force: events.put(("stop", reason, force))):
        while True:
            kind, first, second = events.get()
            if kind == "exit":
                break
            process.close()
    output.finish()
    if first is None:
        err_console().print(f"tflab: the command in {node} ended with no exit code: {second}", markup=False)
        return 255
    return int(first)


def ssh_argv(target: tuple[str, int], key: Path, options: list[str], remote: list[str]) -> list[str]:
    """ssh to a node through its published port with the lab key; `remote` keeps its quoting."""
    host, port = target
    argv = [
        "ssh", "-i", str(key), "-p", str(port), *options,
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", f"root@{host}",
    ]
    # ssh joins its remaining words with spaces for the remote shell: quote them first.
    return argv + ([shlex.join(remote)] if remote else [])


def ssh(
    node: Annotated[str, typer.Argument(help="The node to open a shell on.")],
    remote: Annotated[list[str] | None, typer.Argument(help="A command to run instead of a shell.")] = None,
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
    targets = backend(lf, engine.client()).ssh_targets()
    sys.exit(subprocess.call(ssh_argv(targets[node], lf.private_key, [], words)))
