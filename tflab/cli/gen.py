"""`tflab gen`: a topology becomes a lab folder."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Annotated

import typer

from tflab import resources
from tflab.cli import views
from tflab.cli.common import LabOption, console
from tflab.errors import UserError
from tflab.host import buildsettings, hardware, labfiles, ports, proc
from tflab.plan import config as cfg
from tflab.plan import taskfile
from tflab.plan import links, shares
from tflab.plan.gpus import Gpu, parse_gpu_list
from tflab.plan.topology import (
    LOOPBACK,
    SSH_PORT_BASE,
    TENSORBOARD_PORT_BASE,
    Topology,
    plan,
)


def host_gpus(spec: str | None) -> list[Gpu]:
    """The GPUs to split: the explicit --gpus list, else what nvidia-smi reports."""
    if spec is not None:
        return parse_gpu_list(spec)
    return hardware.discover(proc.run)


def host_memlock_limit() -> int:
    """The most locked memory a container may get here: unlimited (-1) where the host allows it."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard


def lab_relative(path: str | None, root: Path, flag: str) -> str | None:
    """A folder given on the command line (relative to here), as tflab.yaml keeps it: relative to the lab."""
    if path is None:
        return None
    folder = Path(path).resolve()
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: no such folder")
    return os.path.relpath(folder, root)


def lab_packages(pip: list[str], apt: list[str], code_dir: Path | None) -> cfg.Packages:
    """The lab's packages from --pip/--apt, and the code folder's requirements.txt when it has one."""
    specs = [cfg.check_pip(spec) for spec in pip]
    if code_dir is not None and (code_dir / cfg.REQUIREMENTS).is_file() and f"-r {cfg.REQUIREMENTS}" not in specs:
        specs.append(f"-r {cfg.REQUIREMENTS}")
    for spec in specs:
        if spec.startswith("-r ") and (code_dir is None or not (code_dir / spec[3:]).is_file()):
            raise UserError(f"--pip {spec!r}: no such file in the code folder ({code_dir or 'the bundled examples'})")
    return cfg.Packages(pip=tuple(dict.fromkeys(specs)), apt=tuple(dict.fromkeys(cfg.check_apt(a) for a in apt)))


def folder_text(path: str) -> str:
    """A lab-relative folder as people read it: `code/`, `../data/`, `/srv/data/`."""
    return path.rstrip("/") + "/"


def running_here(root: Path) -> bool:
    """Whether the lab already in `root` has nodes running (False where there is none, or no engine to ask)."""
    if not (root / cfg.LAB_FILE).exists():
        return False
    try:
        from tflab.cli.common import backend

        return any(node.running for node in backend(labfiles.open_lab(root)).status().values())
    except Exception:  # noqa: BLE001 (a lab that cannot be read, or no engine: then the ports' own message)
        return False


def placements(values: list[str], node_names: list[str]) -> dict[str, str]:
    """`--place NODE=HOST` options as a mapping, every node a node of the lab."""
    out: dict[str, str] = {}
    for value in values:
        node, sep, host = value.partition("=")
        if not sep or not node or not host:
            raise UserError(f"--place {value!r}: write NODE=HOST, e.g. --place ps0=gpu-host-1")
        if node not in node_names:
            raise UserError(f"--place {value!r}: no node {node!r} in this lab; its nodes are {', '.join(node_names)}")
        out[node] = cfg.check_host_label(host, f"--place {node}=")
    return out


def gen(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of ps and worker nodes.", rich_help_panel="Topology")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs each node owns (0: a CPU lab).", rich_help_panel="Topology")] = 0,
    ps: Annotated[int | None, typer.Option(help="Parameter servers (default 1 when nodes >= 2).", rich_help_panel="Topology")] = None,
    chief: Annotated[bool, typer.Option(help="Add a dedicated `chief` coordinator node.", rich_help_panel="Topology")] = False,
    evaluator: Annotated[bool, typer.Option(help="Add an `evaluator` node.", rich_help_panel="Topology")] = False,
    gpus: Annotated[str | None, typer.Option(help="Host GPUs to split, e.g. 0-7 or 0,1,4,5 (default: nvidia-smi).", rich_help_panel="Topology")] = None,
    share_gpus: Annotated[bool, typer.Option(help="Let several nodes share a GPU, each with a memory share.", rich_help_panel="Topology")] = False,
    cpus_per_node: Annotated[str, typer.Option(help="CPUs each node owns: auto (an even share, as whole CPUs of its GPUs' NUMA node; a fraction where the host has fewer CPUs than nodes), N, a fraction such as 0.5, or 0 (shared).", rich_help_panel="A node's resources")] = shares.AUTO,
    memory_per_node: Annotated[str, typer.Option(help="Memory each node owns: auto (an even share after a reserve for the host), a size such as 4g, or 0 (no limit).", rich_help_panel="A node's resources")] = shares.AUTO,
    ssh_port_base: Annotated[int, typer.Option(help="Node i's SSH is published on this + i.", rich_help_panel="Ports")] = SSH_PORT_BASE,
    tensorboard_port_base: Annotated[int, typer.Option(help="Node i's TensorBoard is published on this + i.", rich_help_panel="Ports")] = TENSORBOARD_PORT_BASE,
    bind: Annotated[str, typer.Option(help="Host address ports are published on (beyond loopback is your choice).", rich_help_panel="Ports")] = LOOPBACK,
    base: Annotated[str, typer.Option(help="Base image: auto (the official TensorFlow image where its registry answers, else local), official, local (built by `tflab base`, no registry needed) or an image name.", rich_help_panel="Images, code and data")] = cfg.AUTO_BASE,
    code: Annotated[str | None, typer.Option(help="Folder copied to /workspace (default: the bundled examples, written to the lab's code/).", rich_help_panel="Images, code and data")] = None,
    data: Annotated[str | None, typer.Option(help="Folder made available at /data (default: the bundled digits dataset, written to the lab's data/).", rich_help_panel="Images, code and data")] = None,
    data_mode: Annotated[str, typer.Option(help="copy the data into each node, or mount it read-only.", rich_help_panel="Images, code and data")] = "copy",
    runs: Annotated[str, typer.Option(help="Host folder shared by every node at /runs.", rich_help_panel="Images, code and data")] = cfg.DEFAULT_RUNS,
    shm_size: Annotated[str, typer.Option(help="Shared memory of each node.", rich_help_panel="A node's resources")] = "2g",
    link_rate: Annotated[str | None, typer.Option(help="Shape every node's link to this rate (100mbit, 1gbit, 10gbit).", rich_help_panel="Links and faults")] = None,
    link_delay: Annotated[str | None, typer.Option(help="Add this one-way delay in milliseconds to every node's link (needs netem).", rich_help_panel="Links and faults")] = None,
    faults: Annotated[bool, typer.Option(help="Let `tflab fault` and drills slow or cut off nodes' traffic (the nodes get NET_ADMIN).", rich_help_panel="Links and faults")] = False,
    warm: Annotated[bool, typer.Option(help="Keep one TensorFlow interpreter ready in each node, so runs start without the import (about 0.5 GB per node).", rich_help_panel="A node's resources")] = True,
    target: Annotated[str, typer.Option(help="Where the lab runs: compose (this host) or swarm (an existing Docker Swarm).", rich_help_panel="Beyond one host")] = "compose",
    place: Annotated[list[str] | None, typer.Option(help="Swarm: run NODE on the swarm node labelled tflab.host=HOST (NODE=HOST, repeatable).", rich_help_panel="Beyond one host")] = None,
    registry: Annotated[str | None, typer.Option(help="Swarm: the registry `tflab build` pushes the node image to (needed on several hosts).", rich_help_panel="Beyond one host")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="A pip requirement the lab's code needs (pandas, numpy<2, -r FILE of the code folder); repeatable. A requirements.txt in the code folder is taken by itself.", rich_help_panel="Images, code and data")] = None,
    apt: Annotated[list[str] | None, typer.Option("--apt", help="A Debian/Ubuntu package the lab's code needs (libsndfile1); repeatable.", rich_help_panel="Images, code and data")] = None,
    tensorflow: Annotated[str | None, typer.Option("--tensorflow", help="Pin TensorFlow to this version (2.15.0): the official image of that version, or tflab's own base with it (default: the base's own).", rich_help_panel="Images, code and data")] = None,
    name: Annotated[str | None, typer.Option(help="Lab name (default: the folder's name).", rich_help_panel="The lab")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing lab (its code/ and data/ stay).", rich_help_panel="The lab")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Write a lab: tflab.yaml, the compose file, the node Dockerfile, the lab's SSH keys, and code/data to start from."""
    if data_mode not in ("copy", "mount"):
        raise UserError(f"--data-mode must be copy or mount, not {data_mode!r}")
    if target not in cfg.TARGETS:
        raise UserError(f"--target must be {' or '.join(cfg.TARGETS)}, not {target!r}")
    shaped = links.Links(
        rate=links.parse_rate(link_rate) if link_rate is not None else None,
        delay_ms=links.parse_delay(link_delay) if link_delay is not None else None,
    )
    topology = Topology(
        nodes=nodes, ps=ps, chief=chief, evaluator=evaluator, gpus_per_node=gpus_per_node,
        share_gpus=share_gpus, ssh_port_base=ssh_port_base,
        tensorboard_port_base=tensorboard_port_base, bind=bind,
        cpus_per_node=shares.check_cpu_choice(cpus_per_node),
        memory_per_node=shares.check_memory_choice(memory_per_node),
    )
    root = lab.resolve()
    if (root / cfg.LAB_FILE).exists() and not force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    scaffold: dict[str, dict[str, bytes]] = {}
    if code is None:
        examples = resources.example_files()
        scaffold[cfg.CODE_DIR] = examples
        existing = root / cfg.CODE_DIR
        tasks = (labfiles.code_tasks(existing) if existing.is_dir()
                 else taskfile.tasks_from_text(examples[cfg.LAB_FILE].decode(), "tflab's examples"))
        code = cfg.CODE_DIR
    else:
        code = lab_relative(code, root, "--code") or cfg.CODE_DIR
        tasks = labfiles.code_tasks((root / code).resolve())
    if data is None:
        scaffold[cfg.DATA_DIR] = resources.example_data()
        data = cfg.DATA_DIR
    else:
        data = lab_relative(data, root, "--data") or cfg.DATA_DIR
    if target != "swarm" and (place or registry):
        raise UserError("--place and --registry are for swarm labs: add --target swarm")
    if target == "swarm":
        cfg.check_swarm_bind(bind)
    listed = host_gpus(gpus) if gpus_per_node > 0 or gpus is not None else []
    host = hardware.host_facts(proc.run, listed)
    planned = plan(topology, listed, host)
    swarm = cfg.SwarmSettings(place=placements(place or [], planned.names), registry=registry)
    cfg.check_one_line(name or root.name or "lab", "--name" if name else "the lab's name (its folder's)")
    cfg.check_image_ref(base, "--base")
    packages = lab_packages(pip or [], apt or [], (root / code).resolve() if code is not None else None)
    if tensorflow is not None:
        cfg.check_tensorflow(tensorflow)
        if base == "local":
            mirror = buildsettings.parse_apt_sources(buildsettings.read_apt_sources())
            cfg.check_tensorflow(tensorflow, mirror.python, f" (tflab's own base: Debian/Ubuntu {mirror.suite})")
    config = cfg.LabConfig(
        name=name or root.name or "lab",
        target=target,
        topology=topology,
        gpus=tuple(listed),
        host=host,
        base_image=base,
        code=code,
        data=data,
        data_mode=data_mode,
        runs=runs,
        shm_size=shm_size,
        # Swarm applies memlock itself and refuses -1 on some engines: left out unless asked.
        memlock=host_memlock_limit() if target == "compose" else None,
        tasks=tasks,
        links=shaped,
        faults=faults,
        swarm=swarm,
        warm=warm,
        packages=packages,
        tensorflow=tensorflow,
    )
    if (root / cfg.LAB_FILE).exists() and not force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    if target == "compose":
        try:
            ports.require_free(
                bind,
                [(n.name, "SSH", n.ssh_port) for n in planned.nodes]
                + [(n.name, "TensorBoard", n.tensorboard_port) for n in planned.nodes],
            )
        except UserError:
            if running_here(root):
                raise UserError(f"the lab in {root} is up: `tflab down --lab {root}` first, then gen --force "
                                "(its nodes hold its ports)") from None
            raise
    written = labfiles.write_lab(config, root, force, scaffold)
    out = console()
    out.print(views.lab_table(written.lab, bind, title=f"lab '{config.name}' in {root}"))
    picture = views.gpu_map(written.lab, listed)
    if picture is not None:
        out.print(picture)
    out.print(views.machines_text(written.lab, host))
    if written.warm_off:
        out.print(written.warm_off)
    if shaped:
        out.print(f"links: {shaped.describe()} on every node's link, both ways")
    if tasks:
        out.print(f"tasks: {', '.join(tasks)} (in tflab.yaml; code in {folder_text(code)}, "
                  f"data in {folder_text(data)})")
    out.print(f"next: tflab up{'' if root == Path.cwd().resolve() else f' --lab {lab}'}")
