"""The tflab command line: thin Typer commands over the layers below."""

from __future__ import annotations

import logging
import os
import resource
import sys
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from tflab import config as cfg
from tflab import gpus as gpu_discovery
from tflab import labfiles, ports, proc, views
from tflab.errors import TflabError, UserError
from tflab.model import LOOPBACK, SSH_PORT_BASE, TENSORBOARD_PORT_BASE, Topology, plan


class TflabGroup(TyperGroup):
    """Every error reaches the user as one line on stderr and an exit code, never a traceback."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
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
        except TflabError as exc:
            click.echo(f"tflab: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        sys.exit(result if isinstance(result, int) else 0)


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
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every command tflab runs.")] = False,
) -> None:
    """Turn one GPU server into a lab of SSH-enabled TensorFlow machines."""
    if verbose:
        logging.getLogger("tflab").setLevel(logging.DEBUG)


LabOption = Annotated[
    Path, typer.Option("--lab", "-C", help="The lab folder (default: the current folder).")
]


def console() -> Console:
    """Rich console on stdout (made per call, so tests can capture it)."""
    return Console(highlight=False, soft_wrap=False)


def err_console() -> Console:
    """Rich console on stderr, for progress."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def host_gpus(spec: str | None) -> list[gpu_discovery.Gpu]:
    """The GPUs to split: the explicit --gpus list, else what nvidia-smi reports."""
    if spec is not None:
        return gpu_discovery.parse_gpu_list(spec)
    return gpu_discovery.discover(proc.run)


def host_memlock_limit() -> int:
    """The most locked memory a container may get here: unlimited (-1) where the host allows it."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard


def lab_relative(path: str | None, root: Path) -> str | None:
    """A folder given on the command line (relative to here), as tflab.yaml keeps it: relative to the lab."""
    if path is None:
        return None
    folder = Path(path).resolve()
    if not folder.is_dir():
        raise UserError(f"{path}: no such folder")
    return os.path.relpath(folder, root)


def registry_reachable(image: str) -> bool:
    """Whether the engine can reach the registry of `image` (asks for its manifest, pulls nothing)."""
    from tflab import engine

    try:
        engine.client().api.inspect_distribution(image)
    except Exception:  # noqa: BLE001 - any failure means: no registry for us
        return False
    return True


def base_image(choice: str, has_gpus: bool) -> str:
    """--base official|local|auto|IMAGE, with the GPU variant when the lab has GPUs.

    auto: the official image when its registry answers, else the local base.
    """
    if choice == "auto":
        official = cfg.OFFICIAL_GPU_BASE if has_gpus else cfg.OFFICIAL_BASE
        choice = "official" if registry_reachable(official) else "local"
    if choice == "official":
        return cfg.OFFICIAL_GPU_BASE if has_gpus else cfg.OFFICIAL_BASE
    if choice == "local":
        return cfg.LOCAL_GPU_BASE if has_gpus else cfg.LOCAL_BASE
    return choice


@app.command()
def gen(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of ps and worker nodes.")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs each node owns (0: a CPU lab).")] = 0,
    ps: Annotated[int | None, typer.Option(help="Parameter servers (default 1 when nodes >= 2).")] = None,
    chief: Annotated[bool, typer.Option(help="Add a dedicated `chief` coordinator node.")] = False,
    evaluator: Annotated[bool, typer.Option(help="Add an `evaluator` node.")] = False,
    gpus: Annotated[str | None, typer.Option(help="Host GPUs to split, e.g. 0-7 or 0,1,4,5 (default: nvidia-smi).")] = None,
    share_gpus: Annotated[bool, typer.Option(help="Let several nodes share a GPU, each with a memory share.")] = False,
    ssh_port_base: Annotated[int, typer.Option(help="Node i's SSH is published on this + i.")] = SSH_PORT_BASE,
    tensorboard_port_base: Annotated[int, typer.Option(help="Node i's TensorBoard is published on this + i.")] = TENSORBOARD_PORT_BASE,
    bind: Annotated[str, typer.Option(help="Host address ports are published on (beyond loopback is your choice).")] = LOOPBACK,
    base: Annotated[str, typer.Option(help="Base image: official (tensorflow/tensorflow), local (built by `tflab base`, no registry needed), auto (official when its registry answers) or an image name.")] = "official",
    code: Annotated[str | None, typer.Option(help="Folder copied to /workspace (relative to the lab).")] = None,
    data: Annotated[str | None, typer.Option(help="Folder made available at /data (relative to the lab).")] = None,
    data_mode: Annotated[str, typer.Option(help="copy the data into each node, or mount it read-only.")] = "copy",
    runs: Annotated[str, typer.Option(help="Host folder shared by every node at /runs.")] = cfg.DEFAULT_RUNS,
    shm_size: Annotated[str, typer.Option(help="Shared memory of each node.")] = "2g",
    name: Annotated[str | None, typer.Option(help="Lab name (default: the folder's name).")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing lab.")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Write a lab: tflab.yaml, the compose file, the node Dockerfile and the lab's SSH keys."""
    if data_mode not in ("copy", "mount"):
        raise UserError(f"--data-mode must be copy or mount, not {data_mode!r}")
    topology = Topology(
        nodes=nodes, ps=ps, chief=chief, evaluator=evaluator, gpus_per_node=gpus_per_node,
        share_gpus=share_gpus, ssh_port_base=ssh_port_base,
        tensorboard_port_base=tensorboard_port_base, bind=bind,
    )
    root = lab.resolve()
    if (root / cfg.LAB_FILE).exists() and not force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    code, data = lab_relative(code, root), lab_relative(data, root)
    listed = host_gpus(gpus) if gpus_per_node > 0 or gpus is not None else []
    config = cfg.LabConfig(
        name=name or root.name or "lab",
        topology=topology,
        gpus=tuple(listed),
        base_image=base_image(base, gpus_per_node > 0),
        code=code,
        data=data,
        data_mode=data_mode,
        runs=runs,
        shm_size=shm_size,
        memlock=host_memlock_limit(),
        tasks=cfg.code_tasks((root / code).resolve()) if code else {},
    )
    planned = plan(topology, listed)
    ports.require_free(
        bind,
        [(n.name, "SSH", n.ssh_port) for n in planned.nodes]
        + [(n.name, "TensorBoard", n.tensorboard_port) for n in planned.nodes],
    )
    written = labfiles.write_lab(config, root, force)
    out = console()
    out.print(views.lab_table(written.lab, bind, title=f"lab {config.name} in {root}"))
    picture = views.gpu_map(written.lab, listed)
    if picture is not None:
        out.print(picture)
    out.print(f"next: tflab up{'' if root == Path.cwd().resolve() else f' --lab {lab}'}")


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    typer.main.get_command(app)()


# Commands of the later layers register themselves on `app`.
from tflab import cli_lab  # noqa: E402,F401  (import for its side effect: the commands)
