"""The tflab command line: the one place every command is registered, and the one error boundary."""

from __future__ import annotations

import difflib
import errno
import importlib.metadata
import logging
import platform
import sys
import traceback
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand, TyperGroup

from tflab.cli import fault as fault_cmd
from tflab.cli import gen as gen_cmd
from tflab.cli import lifecycle as lifecycle_cmd
from tflab.cli import manifests as manifests_cmd
from tflab.cli import runs as runs_cmd
from tflab.cli import sweep as sweep_cmd
from tflab.cli import shell as shell_cmd
from tflab.cli import tools as tools_cmd
from tflab.cli import top as top_cmd
from tflab.cli.common import SETTINGS, StdoutClosed, silence_stdout, stdout_is_closed
from tflab.errors import TflabError


def explain(exc: BaseException) -> tuple[str, int]:
    """One line saying what went wrong and what to do, and the exit code, for any error."""
    import docker.errors
    import requests.exceptions

    from tflab.engine.daemon import daemon_advice

    if isinstance(exc, TflabError):
        return str(exc), exc.exit_code
    if isinstance(exc, requests.exceptions.ConnectionError):
        return daemon_advice(exc), 3
    if isinstance(exc, docker.errors.APIError):
        return f"the Docker engine refused: {exc.explanation or exc}", 3
    if isinstance(exc, docker.errors.DockerException):
        return f"the Docker engine: {exc}; is it running (`tflab doctor`)?", 3
    if isinstance(exc, BrokenPipeError):
        return (f"a process tflab was writing to ended before reading it all ({exc.strerror or exc}); "
                "`tflab -v ...` shows which"), 1
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}", 1
    return f"internal error: {type(exc).__name__}: {exc} (`tflab -v ...` shows where)", 1


class _Carried(Exception):
    """A broken pipe carried past click, which would turn it into a silent exit 1 (whatever pipe broke)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class TflabGroup(TyperGroup):
    """Every error reaches the user as one line on stderr and an exit code, never a traceback (but with -v)."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """A mistyped command gets the closest one named, as a mistyped option does (`tflab rnu`: run)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            if not close or name.startswith("-"):
                raise
            raise click.UsageError(f"no command {name!r}; did you mean {close[0]!r}? (`tflab --help` lists them)",
                                   ctx) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise _Carried(exc).with_traceback(exc.__traceback__) from None
            raise

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,  # type: ignore[override]
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see `tflab {exc.ctx.info_name} --help`)" if exc.ctx and exc.ctx.parent else ""
            click.echo(f"tflab: error: {exc.format_message()}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"tflab: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            click.echo("tflab: interrupted", err=True)
            sys.exit(130)
        except Exception as carried:  # noqa: BLE001 - the boundary: every error becomes a sentence
            error = carried.error if isinstance(carried, _Carried) else carried
            if isinstance(error, StdoutClosed) or (isinstance(error, OSError) and error.errno == errno.EPIPE
                                                   and stdout_is_closed()):
                # Whoever read our output is gone (`| head`): as quiet as any Unix tool.
                silence_stdout()
                sys.exit(141)
            message, code = explain(error)
            if SETTINGS.verbose:
                traceback.print_exception(error)
            click.echo(f"tflab: error: {message}", err=True)
            sys.exit(code)
        sys.exit(result if isinstance(result, int) else 0)


app = typer.Typer(
    cls=TflabGroup,
    help="Turn one GPU server into a lab of SSH-enabled TensorFlow machines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(asked: bool) -> None:
    if asked:
        from tflab_guard import protocol

        try:
            version = importlib.metadata.version("tflab")
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed)"
        click.echo(f"tflab {version} (guard protocol {protocol.VERSION}), Python {platform.python_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every command tflab runs; show tracebacks and TensorFlow's start-up lines.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print tflab's version and exit.", callback=_version, is_eager=True)] = False,
) -> None:
    """Turn one GPU server into a lab of SSH-enabled TensorFlow machines."""
    del version  # said by its callback
    SETTINGS.verbose = verbose
    logging.getLogger("tflab").setLevel(logging.DEBUG if verbose else logging.WARNING)


PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}


class PlainHelp(click.HelpFormatter):
    """Help as plain text, in a terminal and piped: `[default: 4]`, not Typer's Rich-escaped `\\[default: 4]`."""

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        super().write_dl([(term, text.replace("\\[", "[")) for term, text in rows], col_max, col_spacing)


click.Context.formatter_class = PlainHelp


class PanelCommand(TyperCommand):
    """A command whose options are listed in their help panels (topology, resources, ...), in plain text."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panels.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        for title, rows in panels.items():
            with formatter.section(title):
                formatter.write_dl(rows)


class NodeCommand(PanelCommand):
    """`exec`/`ssh`: tflab's options may follow NODE (and a task's name) up to `--`; after it, all is the command's.

    Click ends the options at NODE so that the `--` stays among the arguments (it tells a command
    from a task's name); `tflab exec worker2 --lab DIR -- hostname` is read as
    `tflab exec --lab DIR worker2 -- hostname`, as `kubectl exec` reads its options.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist_options(self.get_params(ctx), args))


def hoist_options(params: list[click.Parameter], args: list[str]) -> list[str]:
    """The known options (with their values) before the first `--` moved ahead of the other words."""
    takes_value: dict[str, bool] = {}
    for param in params:
        if isinstance(param, click.Option):
            for name in (*param.opts, *param.secondary_opts):
                takes_value[name] = not (param.is_flag or param.count)
    end = args.index("--") if "--" in args else len(args)
    options: list[str] = []
    words: list[str] = []
    head = args[:end]
    at = 0
    while at < len(head):
        name = head[at].split("=", 1)[0]
        if name not in takes_value:
            words.append(head[at])
            at += 1
            continue
        width = 2 if takes_value[name] and "=" not in head[at] else 1
        options.extend(head[at:at + width])
        at += width
    return options + words + args[end:]


app.command("gen", cls=PanelCommand)(gen_cmd.gen)
app.command("set", cls=PanelCommand)(gen_cmd.set_)
app.command("base")(lifecycle_cmd.base)
app.command("build")(lifecycle_cmd.build)
app.command("up")(lifecycle_cmd.up)
app.command("status")(lifecycle_cmd.status)
app.command("logs")(lifecycle_cmd.logs)
app.command("down")(lifecycle_cmd.down)
app.command("labs")(lifecycle_cmd.labs)
app.command("exec", cls=NodeCommand, context_settings=PASS_THROUGH)(shell_cmd.exec_)
app.command("ssh", cls=NodeCommand, context_settings=PASS_THROUGH)(shell_cmd.ssh)
app.command("run")(runs_cmd.run)
app.command("runs")(runs_cmd.runs)
app.command("attach")(runs_cmd.attach)
app.command("stop")(runs_cmd.stop)
app.command("sweep")(sweep_cmd.sweep_cmd)
app.command("sweeps")(sweep_cmd.sweeps)
app.command("top")(top_cmd.top)
app.command("tensorboard")(tools_cmd.tensorboard)
app.command("doctor")(tools_cmd.doctor)
app.command("schema")(tools_cmd.schema)
app.command("graph")(tools_cmd.graph)
render = typer.Typer(help="Write the lab for another engine (Kubernetes, Slurm).", no_args_is_help=True)
render.command("k8s")(manifests_cmd.k8s_)
render.command("slurm")(manifests_cmd.slurm_)
app.add_typer(render, name="render")
app.add_typer(fault_cmd.app, name="fault")


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    typer.main.get_command(app)()
