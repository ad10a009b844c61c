"""A new lab from `tflab gen`'s options: every option checked, the host probed, the lab planned once, then written.

Nothing is written until every check has passed (labfiles.write_lab renders everything first).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tflab import resources
from tflab.errors import UserError
from tflab.host import buildsettings, hardware, labfiles, labindex, ports, proc
from tflab.host.labfiles import LabFiles
from tflab.plan import config as cfg
from tflab.plan import links, shares, taskfile
from tflab.plan.gpus import Gpu, parse_gpu_list
from tflab.plan.topology import LOOPBACK, SSH_PORT_BASE, TENSORBOARD_PORT_BASE, Topology, plan, roles


@dataclass(frozen=True)
class LabRequest:
    """`tflab gen`'s options, as given."""

    root: Path
    nodes: int = 4
    gpus_per_node: int = 0
    ps: int | None = None
    chief: bool = False
    evaluator: bool = False
    gpus: str | None = None
    share_gpus: bool = False
    cpus_per_node: str = shares.AUTO
    memory_per_node: str = shares.AUTO
    ssh_port_base: int | None = None  # None: the first free range from SSH_PORT_BASE on (a compose lab)
    tensorboard_port_base: int | None = None  # None: likewise from TENSORBOARD_PORT_BASE
    bind: str = LOOPBACK
    base: str = cfg.AUTO_BASE
    code: str | None = None
    data: str | None = None
    data_mode: str = "copy"
    runs: str = cfg.DEFAULT_RUNS
    shm_size: str = "2g"
    link_rate: str | None = None
    link_delay: str | None = None
    faults: bool = False
    target: str = "compose"
    place: list[str] = field(default_factory=list)
    registry: str | None = None
    pip: list[str] = field(default_factory=list)
    apt: list[str] = field(default_factory=list)
    tensorflow: str | None = None
    keras: str | int | None = None
    name: str | None = None
    force: bool = False


@dataclass(frozen=True)
class NewLab:
    """A lab just written, and what `gen` shows of it."""

    files: LabFiles
    config: cfg.LabConfig
    gpus: list[Gpu]  # the host's GPUs it split
    ports_note: str | None = None  # why its ports are not the defaults, where another lab holds those


def make_lab(request: LabRequest, lab_is_up: Callable[[Path], bool] = lambda root: False) -> NewLab:
    """Check `request` against the host and write the lab: a one-line error, and nothing written, otherwise.
    `lab_is_up(root)` says whether a lab already in `root` runs (its ports are then its own)."""
    shares.size_bytes(request.shm_size, "--shm-size")  # the engine would refuse it only at `up`
    if request.data_mode not in ("copy", "mount"):
        raise UserError(f"--data-mode must be copy or mount, not {request.data_mode!r}")
    if request.target not in cfg.TARGETS:
        raise UserError(f"--target must be {' or '.join(cfg.TARGETS)}, not {request.target!r}")
    shaped = links.Links(
        rate=links.parse_rate(request.link_rate) if request.link_rate is not None else None,
        delay_ms=links.parse_delay(request.link_delay) if request.link_delay is not None else None,
    )
    topology = Topology(
        nodes=request.nodes, ps=request.ps, chief=request.chief, evaluator=request.evaluator,
        gpus_per_node=request.gpus_per_node,
        share_gpus=request.share_gpus,
        ssh_port_base=SSH_PORT_BASE if request.ssh_port_base is None else request.ssh_port_base,
        tensorboard_port_base=(TENSORBOARD_PORT_BASE if request.tensorboard_port_base is None
                               else request.tensorboard_port_base), bind=request.bind,
        cpus_per_node=shares.check_cpu_choice(request.cpus_per_node),
        memory_per_node=shares.check_memory_choice(request.memory_per_node),
    )
    root = request.root.resolve()
    if (root / cfg.LAB_FILE).exists() and not request.force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    with labindex.locked():  # one gen at a time takes ports, and keeps the ones it took
        made = write_new_lab(request, topology, root, shaped, lab_is_up)
        labindex.record(root)
    return made


def write_new_lab(request: LabRequest, topology: Topology, root: Path, shaped: links.Links,
                  lab_is_up: Callable[[Path], bool]) -> NewLab:
    """make_lab's lab, once no other gen takes ports: its ports, the host, the plan, the files."""
    topology, ports_note = free_ports(request, topology, labindex.claimed(root))
    scaffold: dict[str, dict[str, bytes]] = {}
    if request.code is None:
        examples = resources.example_files()
        scaffold[cfg.CODE_DIR] = examples
        existing = root / cfg.CODE_DIR
        tasks = (labfiles.code_tasks(existing) if existing.is_dir()
                 else taskfile.tasks_from_text(examples[cfg.LAB_FILE].decode(), "tflab's examples"))
        code = cfg.CODE_DIR
    else:
        code = lab_relative(request.code, root, "--code") or cfg.CODE_DIR
        tasks = labfiles.code_tasks((root / code).resolve())
    if request.data is None:
        scaffold[cfg.DATA_DIR] = resources.example_data()
        data = cfg.DATA_DIR
    else:
        data = lab_relative(request.data, root, "--data") or cfg.DATA_DIR
    if request.target != "swarm" and (request.place or request.registry):
        raise UserError("--place and --registry are for swarm labs: add --target swarm")
    if request.target == "swarm":
        cfg.check_swarm_bind(request.bind)
    listed = host_gpus(request.gpus) if request.gpus_per_node > 0 or request.gpus is not None else []
    host = hardware.host_facts(proc.run, listed)
    planned = plan(topology, listed, host)
    swarm = cfg.SwarmSettings(place=placements(request.place, planned.names), registry=request.registry)
    cfg.check_one_line(request.name or root.name or "lab",
                       "--name" if request.name else "the lab's name (its folder's)")
    cfg.check_image_ref(request.base, "--base")
    packages = lab_packages(request.pip, request.apt, (root / code).resolve())
    keras = cfg.check_keras(request.keras) if request.keras is not None else None
    if request.tensorflow is not None:
        cfg.check_tensorflow(request.tensorflow)
        if request.base == "local":
            mirror = buildsettings.parse_apt_sources(buildsettings.read_apt_sources())
            cfg.check_tensorflow(request.tensorflow, mirror.python,
                                 f" (tflab's own base: Debian/Ubuntu {mirror.suite})")
        buildsettings.check_keras_2(request.tensorflow, keras, proc.run)
    config = cfg.LabConfig(
        name=request.name or root.name or "lab",
        target=request.target,
        topology=topology,
        gpus=tuple(listed),
        host=host,
        base_image=request.base,
        code=code,
        data=data,
        data_mode=request.data_mode,
        runs=request.runs,
        shm_size=request.shm_size,
        # Swarm applies memlock itself and refuses -1 on some engines: left out unless asked.
        memlock=hardware.memlock_limit() if request.target == "compose" else None,
        tasks=tasks,
        links=shaped,
        faults=request.faults,
        swarm=swarm,
        packages=packages,
        tensorflow=request.tensorflow,
        keras=keras,
    )
    labfiles.check_paths(config, root, scaffold)  # the user's own folders are named before the host's ports
    if request.target == "compose":
        try:
            ports.require_free(
                request.bind,
                [(n.name, "SSH", n.ssh_port) for n in planned.nodes]
                + [(n.name, "TensorBoard", n.tensorboard_port) for n in planned.nodes],
            )
        except UserError:
            if lab_is_up(root):
                raise holds_its_ports(root) from None
            raise
        if ports_note and lab_is_up(root):  # its ports were taken: by the lab here itself, maybe
            raise holds_its_ports(root)
    written = labfiles.write_lab(config, root, request.force, scaffold, planned=planned)
    return NewLab(written, config, listed, ports_note)


def holds_its_ports(root: Path) -> UserError:
    return UserError(f"the lab in {root} is up: `tflab down --lab {root}` first, then gen --force (its nodes hold "
                     "its ports)")


def free_ports(request: LabRequest, topology: Topology, claimed: set[int]) -> tuple[Topology, str | None]:
    """The topology with the ports of a compose lab whose bases were not given: the first free ranges from the
    defaults on, passing by ports in use and those another lab generated here publishes (`claimed`, up or not),
    and a note of them where they are not the defaults."""
    if request.target != "compose" or (request.ssh_port_base is not None and request.tensorboard_port_base is not None):
        return topology, None
    count = len(roles(topology))
    ssh = topology.ssh_port_base if request.ssh_port_base is not None else \
        ports.first_free_base(request.bind, SSH_PORT_BASE, count, avoid=claimed)
    board = topology.tensorboard_port_base if request.tensorboard_port_base is not None else \
        ports.first_free_base(request.bind, TENSORBOARD_PORT_BASE, count, avoid=claimed | set(range(ssh, ssh + count)))
    if (ssh, board) == (topology.ssh_port_base, topology.tensorboard_port_base):
        return topology, None
    return replace(topology, ssh_port_base=ssh, tensorboard_port_base=board), (
        f"ports: SSH {ssh}-{ssh + count - 1}, TensorBoard {board}-{board + count - 1} (the first free from "
        f"{SSH_PORT_BASE} and {TENSORBOARD_PORT_BASE}: another lab, or something else, holds those; "
        "--ssh-port-base and --tensorboard-port-base choose)")


def host_gpus(spec: str | None) -> list[Gpu]:
    """The GPUs to split: the explicit --gpus list, else what nvidia-smi reports."""
    if spec is not None:
        return parse_gpu_list(spec)
    return hardware.discover(proc.run)


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
