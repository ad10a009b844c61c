"""`tflab gen`: a topology becomes a lab folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tflab.cli import views
from tflab.cli.common import LabOption, console, err_console
from tflab.host import labfiles
from tflab.host.newlab import LabRequest, make_lab
from tflab.plan import config as cfg
from tflab.plan import shares
from tflab.plan.topology import LOOPBACK


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
    ssh_port_base: Annotated[int | None, typer.Option(help="Node i's SSH is published on this + i (default: the first free range from 20022 on).", rich_help_panel="Ports")] = None,
    tensorboard_port_base: Annotated[int | None, typer.Option(help="Node i's TensorBoard is published on this + i (default: the first free range from 26006 on).", rich_help_panel="Ports")] = None,
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
    warm: Annotated[bool | None, typer.Option(hidden=True, help="Retired: accepted, and does nothing (every program starts cold).")] = None,
    target: Annotated[str, typer.Option(help="Where the lab runs: compose (this host) or swarm (an existing Docker Swarm).", rich_help_panel="Beyond one host")] = "compose",
    place: Annotated[list[str] | None, typer.Option(help="Swarm: run NODE on the swarm node labelled tflab.host=HOST (NODE=HOST, repeatable).", rich_help_panel="Beyond one host")] = None,
    registry: Annotated[str | None, typer.Option(help="Swarm: the registry `tflab build` pushes the node image to (needed on several hosts).", rich_help_panel="Beyond one host")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="A pip requirement the lab's code needs (pandas, numpy<2, -r FILE of the code folder); repeatable. A requirements.txt in the code folder is taken by itself.", rich_help_panel="Images, code and data")] = None,
    apt: Annotated[list[str] | None, typer.Option("--apt", help="A Debian/Ubuntu package the lab's code needs (libsndfile1); repeatable.", rich_help_panel="Images, code and data")] = None,
    tensorflow: Annotated[str | None, typer.Option("--tensorflow", help="Pin TensorFlow to this version (2.15.0): the official image of that version, or tflab's own base with it (default: the base's own).", rich_help_panel="Images, code and data")] = None,
    keras: Annotated[str | None, typer.Option("--keras", help="2: Keras 2 (tf-keras of the image's TensorFlow, TF_USE_LEGACY_KERAS=1 in every node) for programs written for it; TensorFlow 2.16 and later ship Keras 3 (default: the TensorFlow's own Keras).", rich_help_panel="Images, code and data")] = None,
    name: Annotated[str | None, typer.Option(help="Lab name (default: the folder's name).", rich_help_panel="The lab")] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing lab (its code/ and data/ stay).", rich_help_panel="The lab")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Write a lab: tflab.yaml, the compose file, the node Dockerfile, the lab's SSH keys, and code/data to start from."""
    request = LabRequest(
        root=lab, nodes=nodes, gpus_per_node=gpus_per_node, ps=ps, chief=chief, evaluator=evaluator, gpus=gpus,
        share_gpus=share_gpus, cpus_per_node=cpus_per_node, memory_per_node=memory_per_node,
        ssh_port_base=ssh_port_base, tensorboard_port_base=tensorboard_port_base, bind=bind, base=base, code=code,
        data=data, data_mode=data_mode, runs=runs, shm_size=shm_size, link_rate=link_rate, link_delay=link_delay,
        faults=faults, target=target, place=place or [], registry=registry, pip=pip or [],
        apt=apt or [], tensorflow=tensorflow, keras=keras, name=name, force=force,
    )
    if warm is not None:
        err_console().print(f"tflab: note: --{'' if warm else 'no-'}warm no longer does anything: every program starts "
                            "cold, as on a cluster's machine", markup=False)
    made = make_lab(request, lab_is_up=running_here)
    written, config, listed = made.files, made.config, made.gpus
    root, host, shaped, tasks = written.root, config.host, config.links, config.tasks
    code, data = config.code or cfg.CODE_DIR, config.data or cfg.DATA_DIR
    out = console()
    out.print(views.lab_table(written.lab, bind, title=f"lab '{config.name}' in {root}"))
    picture = views.gpu_map(written.lab, listed)
    if picture is not None:
        out.print(picture)
    out.print(views.machines_text(written.lab, host))
    if made.ports_note:
        out.print(made.ports_note)
    if shaped:
        out.print(f"links: {shaped.describe()} on every node's link, both ways")
    if tasks:
        out.print(f"tasks: {', '.join(tasks)} (in tflab.yaml; code in {folder_text(code)}, "
                  f"data in {folder_text(data)})")
    out.print(f"next: tflab up{'' if root == Path.cwd().resolve() else f' --lab {lab}'}")
