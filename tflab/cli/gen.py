"""`tflab gen`: a topology becomes a lab folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tflab.cli import views
from tflab.cli.common import LabOption, console, err_console
from tflab.host import labfiles
from tflab.host.newlab import LabRequest, make_lab
from tflab.host.setlab import SetRequest, set_lab
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
    small = next((why for why in (shares.too_small(n.share) for n in written.lab.nodes) if why), None)
    if small:
        out.print(f"warning: {small}", style="yellow", markup=False, soft_wrap=True)
    if made.ports_note:
        out.print(made.ports_note)
    if shaped:
        out.print(f"links: {shaped.describe()} on every node's link, both ways")
    if tasks:
        out.print(f"tasks: {', '.join(tasks)} (in tflab.yaml; code in {folder_text(code)}, "
                  f"data in {folder_text(data)})")
    else:
        out.print(f"no task yet (code in {folder_text(code)}): add one, as every node runs it: tflab set --task "
                  f"main='python /workspace/YOUR_PROGRAM.py'{'' if root == Path.cwd().resolve() else f' --lab {lab}'}",
                  markup=False, soft_wrap=True)
    out.print(f"next: tflab up{'' if root == Path.cwd().resolve() else f' --lab {lab}'}")


def set_(
    nodes: Annotated[int | None, typer.Option(help="Machines in the lab.", rich_help_panel="The lab")] = None,
    ps: Annotated[int | None, typer.Option(help="Parameter servers.", rich_help_panel="The lab")] = None,
    chief: Annotated[bool | None, typer.Option("--chief/--no-chief", help="A dedicated coordinator node `chief`.", rich_help_panel="The lab")] = None,
    evaluator: Annotated[bool | None, typer.Option("--evaluator/--no-evaluator", help="A node `evaluator`.", rich_help_panel="The lab")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(help="GPUs each node owns (of the GPUs tflab.yaml lists).", rich_help_panel="A node's resources")] = None,
    cpus_per_node: Annotated[str | None, typer.Option(help="auto, 0 (shared) or CPUs per node.", rich_help_panel="A node's resources")] = None,
    memory_per_node: Annotated[str | None, typer.Option(help="auto, 0 (shared) or a size per node.", rich_help_panel="A node's resources")] = None,
    shm_size: Annotated[str | None, typer.Option(help="Shared memory of each node.", rich_help_panel="A node's resources")] = None,
    keras: Annotated[str | None, typer.Option("--keras", help="2: Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1); none: the TensorFlow's own.", rich_help_panel="Images, code and data")] = None,
    tensorflow: Annotated[str | None, typer.Option("--tensorflow", help="Pin TensorFlow to this version; none: the base's own.", rich_help_panel="Images, code and data")] = None,
    pip: Annotated[list[str] | None, typer.Option("--pip", help="Add a pip requirement (repeatable).", rich_help_panel="Images, code and data")] = None,
    apt: Annotated[list[str] | None, typer.Option("--apt", help="Add a Debian/Ubuntu package (repeatable).", rich_help_panel="Images, code and data")] = None,
    base: Annotated[str | None, typer.Option(help="auto, official, local or an image.", rich_help_panel="Images, code and data")] = None,
    link_rate: Annotated[str | None, typer.Option(help="Every node's link rate (100mbit, 1gbit); none: unshaped.", rich_help_panel="Links and faults")] = None,
    link_delay: Annotated[str | None, typer.Option(help="One-way delay in ms of every link; none: no delay.", rich_help_panel="Links and faults")] = None,
    faults: Annotated[bool | None, typer.Option("--faults/--no-faults", help="Let `tflab fault` slow or cut nodes (NET_ADMIN).", rich_help_panel="Links and faults")] = None,
    task: Annotated[list[str] | None, typer.Option("--task", help="Add a task, or change its command: NAME=COMMAND (repeatable).", rich_help_panel="Tasks")] = None,
    drop_task: Annotated[list[str] | None, typer.Option("--drop-task", help="Remove a task (repeatable).", rich_help_panel="Tasks")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Change an existing lab's settings with gen's options: everything not named stays (tasks, code, data, ports)."""
    request = SetRequest(nodes=nodes, ps=ps, chief=chief, evaluator=evaluator, gpus_per_node=gpus_per_node,
                         cpus_per_node=cpus_per_node, memory_per_node=memory_per_node, keras=keras,
                         tensorflow=tensorflow, pip=pip, apt=apt, base=base, shm_size=shm_size, link_rate=link_rate,
                         link_delay=link_delay, faults=faults, tasks=tuple(task or ()), drop_tasks=tuple(drop_task or ()))
    written, changes = set_lab(lab, request)
    out = console()
    if not changes:
        out.print("nothing changed: the lab has these settings already")
        return
    out.print(f"changed in {written.root / cfg.LAB_FILE}:", markup=False, soft_wrap=True)
    for change in changes:
        out.print(f"  {change}", markup=False, soft_wrap=True)
    out.print(f"next: tflab up{'' if written.root == Path.cwd().resolve() else f' --lab {lab}'}", markup=False,
              soft_wrap=True)
