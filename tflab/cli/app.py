"""The tflab command line: the one place every command is registered, and the one error boundary."""

from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
from typing import Annotated, Any

import click
import typer
from typer.core import TyperGroup

from tflab.cli import gen as gen_cmd
from tflab.cli import lab as lab_cmd
from tflab.cli import nodes as nodes_cmd
from tflab.cli import render as render_cmd
from tflab.cli import runs as runs_cmd
from tflab.cli import tools as tools_cmd
from tflab.cli.common import SETTINGS
from tflab.errors import TflabError


def explain(exc: BaseException) -> tuple[str, int]:
    """One line saying what went wrong and what to do, and the exit code, for any error."""
    import docker.errors
    import requests.exceptions

    from tflab.engine import daemon_advice

    if isinstance(exc, TflabError):
        return str(exc), exc.exit_code
    if isinstance(exc, requests.exceptions.ConnectionError):
        return daemon_advice(exc), 3
    if isinstance(exc, docker.errors.APIError):
        return f"the Docker engine refused: {exc.explanation or exc}", 3
    if isinstance(exc, docker.errors.DockerException):
        return f"the Docker engine: {exc}; is it running (`tflab doctor`)?", 3
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}", 1
    return f"internal error: {type(exc).__name__}: {exc} (`tflab -v ...` shows where)", 1


class TflabGroup(TyperGroup):
    """Every error reaches the user as one line on stderr and an exit code, never a traceback (but with -v)."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
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
        except BrokenPipeError:
            _silence_stdout()
            sys.exit(141)
        except Exception as exc:  # noqa: BLE001 - the boundary: every error becomes a sentence
            if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
                _silence_stdout()
                sys.exit(141)
            message, code = explain(exc)
            if SETTINGS.verbose:
                traceback.print_exc()
            click.echo(f"tflab: error: {message}", err=True)
            sys.exit(code)
        sys.exit(result if isinstance(result, int) else 0)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that nothing more is written to a closed pipe (not even at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


app = typer.Typer(
    cls=TflabGroup,
    help="Turn one GPU server into a lab of SSH-enabled TensorFlow machines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every command tflab runs; show tracebacks and TensorFlow's start-up lines.")] = False,
) -> None:
    """Turn one GPU server into a lab of SSH-enabled TensorFlow machines."""
    SETTINGS.verbose = verbose
    logging.getLogger("tflab").setLevel(logging.DEBUG if verbose else logging.WARNING)


PASS_THROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}

app.command("gen")(gen_cmd.gen)
app.command("base")(lab_cmd.base)
app.command("build")(lab_cmd.build)
app.command("up")(lab_cmd.up)
app.command("status")(lab_cmd.status)
app.command("logs")(lab_cmd.logs)
app.command("down")(lab_cmd.down)
app.command("exec", context_settings=PASS_THROUGH)(nodes_cmd.exec_)
app.command("ssh", context_settings=PASS_THROUGH)(nodes_cmd.ssh)
app.command("run")(runs_cmd.run)
app.command("runs")(runs_cmd.runs)
app.command("attach")(runs_cmd.attach)
app.command("stop")(runs_cmd.stop)
app.command("tensorboard")(tools_cmd.tensorboard)
app.command("doctor")(tools_cmd.doctor)
render = typer.Typer(help="Write the lab for another engine (Kubernetes).", no_args_is_help=True)
render.command("k8s")(render_cmd.k8s_)
app.add_typer(render, name="render")


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    typer.main.get_command(app)()
