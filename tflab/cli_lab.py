"""Commands that drive a lab on the engine: base, build, up, status, logs, exec, ssh, down."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator

import click
import typer
from rich.markup import escape

from tflab import engine, hostsettings, image, lab as lab_ops, labfiles, launcher, nodes, proc, tasks, views
from tflab.cli import LabOption, app, console, err_console
from tflab.errors import UserError


@contextmanager
def progress_line(title: str) -> Iterator[image.Progress]:
    """A spinner showing the step's latest line (plain lines when stderr is not a terminal)."""
    err = err_console()
    if err.is_terminal:
        with err.status(title) as status:
            # Build output may hold brackets; escaped, Rich shows them instead of reading markup.
            yield lambda line: status.update(f"{title}: [dim]{escape(line[-110:])}[/dim]")
    else:
        last: list[str] = []

        def show(line: str) -> None:
            # Off a terminal, show the steps, not every pip line.
            if not last or line.split(" ")[0] != last[-1].split(" ")[0]:
                err.print(f"  {title}: {line[-150:]}", markup=False)
            last.append(line)

        yield show


def compose_for(lf: labfiles.LabFiles) -> engine.Compose:
    """The compose CLI bound to this lab."""
    return engine.Compose(lf.compose_path, lf.project)


@app.command()
def base(
    gpu: Annotated[bool, typer.Option(help="Build the GPU variant (tensorflow[and-cuda]).")] = False,
    force: Annotated[bool, typer.Option(help="Build again even if it exists.")] = False,
    ca_bundle: Annotated[str | None, typer.Option(help="CA bundle pip must trust (default: the host's).")] = None,
    index_url: Annotated[str | None, typer.Option(help="pip index to use (default: the host's pip setting).")] = None,
    tensorflow: Annotated[str | None, typer.Option(help="pip requirement for TensorFlow (default tensorflow-cpu).")] = None,
) -> None:
    """Build the local base image (debootstrap + pip) for hosts with no container registry."""
    client = engine.client()
    mirror = hostsettings.parse_apt_sources(hostsettings.read_apt_sources())
    pip = hostsettings.pip_settings(proc.run, os.environ, ca_bundle, index_url)
    with progress_line("base image") as progress:
        result = image.build_base(client, mirror, pip, progress, gpu=gpu, force=force, tensorflow=tensorflow)
    if result.built:
        console().print(f"built {result.tag} ({result.image_id[7:19]}) from {mirror.uri} {mirror.suite}; log: {result.log}")
    else:
        console().print(f"{result.tag} is up to date ({result.image_id[7:19]})")


@app.command()
def build(
    force: Annotated[bool, typer.Option(help="Build again even if the image exists.")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Build the lab's node image (skipped when an image of the same inputs exists)."""
    lf = labfiles.open_lab(lab)
    client = engine.client()
    with progress_line("node image") as progress:
        result = lab_ops.ensure_image(lf, client, progress, force=force)
    lf.write_compose(result.tag)
    if result.built:
        console().print(f"built {result.tag} ({result.image_id[7:19]}); log: {result.log}")
    else:
        console().print(f"{result.tag} is up to date ({result.image_id[7:19]})")


@app.command()
def up(lab: LabOption = Path(".")) -> None:
    """Start the lab: build if needed, start nodes, wait for sshd, copy code and data."""
    lf = labfiles.open_lab(lab)
    client = engine.client()
    with progress_line("up") as progress:
        copied = lab_ops.up(lf, client, compose_for(lf), progress)
    out = console()
    out.print(views.status_table(lf.lab, lab_ops.status(lf, client), lf.lab.topology.bind))
    if copied:
        out.print("copied: " + ", ".join(copied))
    out.print(f"ready: {len(lf.lab.nodes)} nodes; shared runs folder {lf.runs_dir}")


@app.command()
def status(lab: LabOption = Path(".")) -> None:
    """Each node's state and health, GPUs and ports."""
    lf = labfiles.open_lab(lab)
    states = lab_ops.status(lf, engine.client())
    out = console()
    out.print(views.status_table(lf.lab, states, lf.lab.topology.bind))
    picture = views.gpu_map(lf.lab, lf.config.gpus)
    if picture is not None:
        out.print(picture)
    if not states:
        out.print("the lab is not up (`tflab up` starts it)")


@app.command()
def logs(
    node: Annotated[str | None, typer.Argument(help="One node (default: every node).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
    tail: Annotated[str, typer.Option(help="Lines from the end of each log.")] = "all",
    lab: LabOption = Path("."),
) -> None:
    """The nodes' logs (sshd and anything the entrypoint printed)."""
    lf = labfiles.open_lab(lab)
    if node is not None:
        lf.lab.node(node)
    args = ["logs", "--tail", tail] + (["--follow"] if follow else []) + ([node] if node else [])
    argv = [*engine.find_compose(), "-f", str(lf.compose_path), "-p", lf.project, *args]
    sys.exit(subprocess.call(argv))


@app.command(
    "exec", context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
def exec_(
    node: Annotated[str, typer.Argument(help="The node to run on.")],
    command: Annotated[list[str] | None, typer.Argument(help="TASK from tflab.yaml, or -- CMD ...")] = None,
    tty: Annotated[bool | None, typer.Option("--tty/--no-tty", help="Give it a terminal (default: when stdin is one).")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Run a task (or, after --, any command) as NODE; its exit code is tflab's."""
    lf = labfiles.open_lab(lab)
    lf.lab.node(node)
    words = list(command or [])
    # Options end at NODE, so click leaves a `--` after it among the arguments.
    dashdash = words[:1] == ["--"]
    if dashdash:
        words = words[1:]
    if not words:
        argv, env = ["bash", "-l"], {}
    elif dashdash:
        argv, env = words, {}
    elif len(words) == 1:
        argv, env = tasks.task_argv(lf, node, words[0]), tasks.task_env(words[0])
    else:
        raise UserError(
            f"`tflab exec {node} {' '.join(words)}`: name one task, or put -- before a command"
        )
    client = engine.client()
    container = nodes.running_container(client, lf.project, node)
    use_tty = sys.stdin.isatty() and sys.stdout.isatty() if tty is None else tty
    if use_tty:
        docker_argv = ["docker", "exec", "-it", "-w", "/workspace"]
        for key, value in env.items():
            docker_argv += ["-e", f"{key}={value}"]
        sys.exit(subprocess.call([*docker_argv, container.id, *argv]))
    out, err = click.get_binary_stream("stdout"), click.get_binary_stream("stderr")

    def show(chunk: bytes, is_err: bool) -> None:
        stream = err if is_err else out
        stream.write(chunk)
        stream.flush()

    # Like `run`, keep the process group's id: Ctrl-C here stops the command in the node too
    # (a bare `docker exec` would leave it running there).
    run_id = f"exec-{os.getpid()}"
    try:
        code = nodes.exec_stream(client, container, launcher.wrapped(run_id, node, argv), show, env=env)
    except KeyboardInterrupt:
        nodes.exec_quiet(client, container, launcher.stop_script(run_id, node, 3.0))
        raise
    sys.exit(code)


def ssh_argv(lf: labfiles.LabFiles, node: str, remote: list[str]) -> list[str]:
    """ssh to `node` through its published port with the lab key."""
    target = lf.lab.node(node)
    host = lab_ops.connect_host(lf.lab.topology.bind)
    return [
        "ssh", "-i", str(lf.private_key), "-p", str(target.ssh_port),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "IdentitiesOnly=yes", f"root@{host}", *remote,
    ]


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def ssh(
    node: Annotated[str, typer.Argument(help="The node to open a shell on.")],
    remote: Annotated[list[str] | None, typer.Argument(help="A command to run instead of a shell.")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Open a shell on NODE over SSH with the lab key, through its published port."""
    lf = labfiles.open_lab(lab)
    if shutil.which("ssh") is None:
        raise UserError("no ssh client on this host; install openssh-client")
    sys.exit(subprocess.call(ssh_argv(lf, node, remote or [])))


@app.command()
def down(lab: LabOption = Path(".")) -> None:
    """Stop and remove every container and network of the lab (the runs folder stays)."""
    lf = labfiles.open_lab(lab)
    removed, networks = lab_ops.down(lf.project, engine.client())
    if removed or networks:
        console().print(f"removed {removed} node(s) and {networks} network(s); outputs stay in {lf.runs_dir}")


from tflab import cli_run  # noqa: E402,F401  (registers `run`, `tensorboard`, `doctor`)
