"""What the command modules share: the lab option, consoles, progress, the lab's engine side."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console
from rich.markup import escape

from tflab.engine import daemon, guardcmd, run_knobs
from tflab.engine.backend import VIAS, LabBackend
from tflab.engine.sides import open_backend
from tflab.engine.builds import Progress
from tflab.engine.faults import FaultInjector
from tflab.errors import TflabError, UserError
from tflab.host import labfiles
from tflab.host.labfiles import LabFiles
from tflab.host.ports import wait_for_http
from tflab.plan.progress import LineSplitter, is_noise
from tflab.plan.tensordump import TensorCut


@dataclass
class Settings:
    """Options of the root command, for every command."""

    verbose: bool = False


SETTINGS = Settings()
# A user asking for TensorFlow's start-up lines without -v (what `-v` shows too).
SHOW_TF_NOISE_VAR = "TFLAB_SHOW_TF_NOISE"

LabOption = Annotated[Path, typer.Option("--lab", "-C", help="The lab folder (default: the current folder).")]
ViaOption = Annotated[str, typer.Option("--via", help="How to reach the nodes: docker (exec, this host) or ssh (their published SSH ports).")]


def options_again(ctx: click.Context, leave_out: set[str]) -> list[str]:
    """The options this command was given, as a command line that gives them again (a detached run's own
    process gets its caller's options this way): every option but those named in `leave_out`."""
    argv: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in leave_out or param.name is None:
            continue
        value = ctx.params.get(param.name)
        if value is None:
            continue
        if param.is_flag:
            if param.secondary_opts:
                argv.append(param.opts[0] if value else param.secondary_opts[0])
            elif value:
                argv.append(param.opts[0])
            continue
        for each in (value if param.multiple else [value]):
            argv.append(f"{param.opts[0]}={each}")
    return argv


class StdoutClosed(BrokenPipeError):
    """Whoever read tflab's output went away (`tflab run train | head`): not an error to report."""


def silence_stdout() -> None:
    """Point stdout at /dev/null so that nothing more is written to a closed pipe (not even at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def stdout_is_closed() -> bool:
    """Whether the reader of our stdout has gone (a pipe's write end then polls as an error)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), 0)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False  # not a real file (a test's capture): nobody closed it


class PipeConsole(Console):
    """A console that lets a closed stdout be handled by tflab (Rich's default is to exit at once)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        silence_stdout()
        raise StdoutClosed("stdout was closed")


def console() -> Console:
    """Rich console on stdout (made per call, so tests can capture it)."""
    return PipeConsole(highlight=False, soft_wrap=False)


def err_console() -> Console:
    """Rich console on stderr, for progress and messages."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def show_tf_noise() -> bool:
    """Whether TensorFlow's start-up noise is shown (-v, or TFLAB_SHOW_TF_NOISE=1)."""
    return SETTINGS.verbose or os.environ.get(SHOW_TF_NOISE_VAR, "") not in ("", "0")


def keep_line(text: str) -> bool:
    """Whether a node's output line reaches the terminal."""
    return show_tf_noise() or not is_noise(text)


@contextmanager
def progress(title: str) -> Iterator[Progress]:
    """Progress of a long operation: a spinner with the latest line on a terminal; off one, the steps only."""
    err = err_console()
    if err.is_terminal and not SETTINGS.verbose:
        with err.status(title) as status:
            current = [title]

            def step(message: str) -> None:
                current[0] = f"{title}: {message}"
                err.print(f"  {title}: {escape(message)}")
                status.update(escape(current[0]))

            def detail(line: str) -> None:
                # Build output may hold brackets; escaped, Rich shows them instead of reading markup.
                status.update(f"{escape(current[0])}: [dim]{escape(line[-100:])}[/dim]")

            yield Progress(step, detail)
    else:
        def plain_step(message: str) -> None:
            err.print(f"  {title}: {message}", markup=False)

        def plain_detail(line: str) -> None:
            if SETTINGS.verbose:
                err.print(f"    {line[-200:]}", markup=False, style="dim")

        yield Progress(plain_step, plain_detail)


def open_lab(lab: Path) -> labfiles.LabFiles:
    """The lab in `lab` (a one-line error when there is none); a note on stderr where its file names settings this
    tflab no longer has."""
    lf = labfiles.open_lab(lab)
    if lf.retired_note:
        err_console().print(lf.retired_note, markup=False)
    return lf


def check_via(via: str) -> str:
    if via not in VIAS:
        raise UserError(f"--via must be docker or ssh, not {via!r}")
    return via


class StreamOut:
    """A node's raw output passed to our stdout/stderr; TensorFlow's start-up noise dropped from stderr.

    A closed stdout (`tflab exec worker0 -- yes | head -1`) calls `on_broken` once, which ends the
    command in the node as a closed pipe ends a program; what comes after is dropped.
    """

    def __init__(self, on_broken: Callable[[], None] | None = None) -> None:
        self.splitter = LineSplitter()
        self.tensors = TensorCut()  # a traceback's pages of tensor values, cut to its message
        self.out = sys.stdout.buffer
        self.err = sys.stderr.buffer
        self.broken = False
        self.on_broken = on_broken

    def __call__(self, chunk: bytes, is_err: bool) -> None:
        if self.broken:
            return
        try:
            if not is_err:
                self.out.write(chunk)
                self.out.flush()
                return
            lines = self.splitter.feed(chunk)
            self._err_lines(lines)
        except BrokenPipeError:
            self.broken = True
            silence_stdout()
            if self.on_broken is not None:
                self.on_broken()

    def _err_lines(self, lines: list[str], end: bool = False) -> None:
        kept = [shown for line in lines if keep_line(line) for shown in self.tensors.show(line)]
        kept += self.tensors.end() if end else []
        if kept:
            self.err.write(("\n".join(kept) + "\n").encode())
            self.err.flush()

    def finish(self) -> None:
        try:
            self._err_lines(self.splitter.rest(), end=True)
        except BrokenPipeError:
            pass


def backend(lf: labfiles.LabFiles) -> LabBackend:
    """The engine side of the lab (compose on this host, or a swarm), on the engine of this host.

    Where a run that is gone (tflab killed) left its knobs on the nodes, they are restored first.
    """
    side = open_backend(lf, daemon.client())
    if run_knobs.left_behind(lf):
        restore_left_knobs(lf, side)
    return side


def restore_left_knobs(lf: labfiles.LabFiles, side: LabBackend) -> None:
    """Put back the links and CPU quotas a killed run had changed for itself, and say so."""
    note = run_knobs.read_note(lf) or {}
    injector = FaultInjector(lf, daemon.client(), side.executor, lambda node: side.ssh_targets()[node])
    try:
        done = run_knobs.KnobSetter(injector).restore()
    except TflabError as exc:
        err_console().print(f"tflab: run {note.get('task')} ended without restoring what it changed, and restoring "
                            f"it failed: {escape(str(exc))}; `tflab fault clear` tries again", soft_wrap=True)
        return
    if done:
        err_console().print(f"tflab: run {note.get('task')} (pid {note.get('pid')}) ended without restoring what its "
                            f"knobs changed; restored: {'; '.join(done)}", soft_wrap=True)


TENSORBOARD_KEY = "tensorboard"  # the guard's key of the lab's TensorBoard, in its chief node


def board_url(lf: LabFiles, side: LabBackend) -> str:
    """The lab's one TensorBoard: served by its chief node, on its published port."""
    chief = lf.lab.chief
    return f"http://{side.ssh_targets()[chief.name][0]}:{chief.tensorboard_port}/"


def board_serves(url: str) -> bool:
    return wait_for_http(url, deadline=time.monotonic() + 0.5)


def start_board(lf: LabFiles, side: LabBackend) -> str:
    """Start the lab's TensorBoard (detached, not held: it lives until `tflab tensorboard --stop` or `tflab down`), at
    the lowest priority in its node: it never takes the CPU a program there needs. Its URL."""
    chief = lf.lab.chief
    argv = ["nice", "-n", "19", "tensorboard", "--logdir", "/runs", "--host", "0.0.0.0", "--port", "6006",
            "--reload_interval", "5"]
    side.executor([chief.name]).spawn(chief.name, guardcmd.serve_detached(TENSORBOARD_KEY, argv,
                                                                          "/tmp/tflab-tensorboard.log"), workdir="/runs")
    return board_url(lf, side)


def ensure_board(lf: LabFiles, side: LabBackend) -> str:
    """The lab's TensorBoard URL, in words: serving already, or started now."""
    url = board_url(lf, side)
    if board_serves(url):
        return f"TensorBoard: {url}"
    start_board(lf, side)
    return f"TensorBoard: {url} (starting)"
