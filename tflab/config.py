"""tflab.yaml: the lab's single source of truth, read and written here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tflab.errors import UserError
from tflab.gpus import Gpu
from tflab.model import Topology

LAB_FILE = "tflab.yaml"
COMPOSE_FILE = "docker-compose.yml"
IMAGE_DIR = "image"
KEYS_DIR = "keys"
DEFAULT_RUNS = "runs"
PLACEHOLDERS = ("node", "job_name", "task_index", "ps_hosts", "worker_hosts", "num_gpus", "run_dir")
DEFAULT_SERVERS = ("ps",)
OFFICIAL_BASE = "tensorflow/tensorflow:2.18.0"
OFFICIAL_GPU_BASE = "tensorflow/tensorflow:2.18.0-gpu"
LOCAL_BASE = "tflab-base:cpu"
LOCAL_GPU_BASE = "tflab-base:gpu"


@dataclass(frozen=True)
class Task:
    """A named command of tflab.yaml, and the roles that only serve while it runs."""

    name: str
    command: str
    servers: tuple[str, ...] = DEFAULT_SERVERS


@dataclass(frozen=True)
class LabConfig:
    """Everything tflab.yaml holds."""

    name: str
    topology: Topology
    gpus: tuple[Gpu, ...] = ()
    base_image: str = OFFICIAL_BASE
    code: str | None = None
    data: str | None = None
    data_mode: str = "copy"  # copy | mount
    runs: str = DEFAULT_RUNS
    shm_size: str = "2g"
    memlock: int = -1  # bytes of locked memory a node may use; -1 is unlimited (RDMA/NCCL want it)
    tasks: dict[str, Task] = field(default_factory=dict)

    def task(self, name: str) -> Task:
        """The task called `name`, or a UserError naming the tasks there are."""
        if name not in self.tasks:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UserError(f"no task {name!r} in {LAB_FILE}; its tasks are: {known}")
        return self.tasks[name]

    @property
    def uses_local_base(self) -> bool:
        """Whether the base image is the one `tflab base` builds."""
        return self.base_image in (LOCAL_BASE, LOCAL_GPU_BASE)


def fill_placeholders(command: str, values: dict[str, str]) -> str:
    """Put a node's values in `{node}`-style placeholders; other braces are left alone."""
    pattern = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], command)


def parse_tasks(raw: Any, source: str) -> dict[str, Task]:
    """Tasks as tflab.yaml writes them: `name: command` or `name: {command:, servers:}`."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"{source}: `tasks` must map task names to commands")
    tasks: dict[str, Task] = {}
    for name, spec in raw.items():
        if isinstance(spec, str):
            tasks[str(name)] = Task(str(name), spec)
        elif isinstance(spec, dict) and isinstance(spec.get("command"), str):
            servers = spec.get("servers", list(DEFAULT_SERVERS))
            if not isinstance(servers, list) or not all(
                s in ("ps", "worker", "chief", "evaluator") for s in servers
            ):
                raise UserError(f"{source}: task {name!r}: `servers` lists roles (ps, worker, ...)")
            tasks[str(name)] = Task(str(name), spec["command"], tuple(servers))
        else:
            raise UserError(f"{source}: task {name!r} needs a command")
    return tasks


def dump_tasks(tasks: dict[str, Task]) -> dict[str, Any]:
    """Tasks back into their tflab.yaml form (the short form when it says everything)."""
    out: dict[str, Any] = {}
    for name, task in tasks.items():
        if task.servers == DEFAULT_SERVERS:
            out[name] = task.command
        else:
            out[name] = {"command": task.command, "servers": list(task.servers)}
    return out


def to_yaml(config: LabConfig) -> str:
    """tflab.yaml's text for `config`."""
    t = config.topology
    doc: dict[str, Any] = {
        "name": config.name,
        "topology": {
            "nodes": t.nodes,
            "ps": t.ps_count,
            "chief": t.chief,
            "evaluator": t.evaluator,
            "gpus_per_node": t.gpus_per_node,
            "share_gpus": t.share_gpus,
        },
        "gpus": [
            {k: v for k, v in (("index", g.index), ("name", g.name), ("memory_mib", g.memory_mib)) if v or k == "index"}
            for g in config.gpus
        ],
        "ports": {
            "ssh_base": t.ssh_port_base,
            "tensorboard_base": t.tensorboard_port_base,
            "bind": t.bind,
        },
        "image": {"base": config.base_image, "shm_size": config.shm_size, "memlock": config.memlock},
        "code": config.code,
        "data": config.data,
        "data_mode": config.data_mode,
        "runs": config.runs,
        "tasks": dump_tasks(config.tasks),
    }
    header = (
        "# tflab lab: edit it, then run `tflab up` again.\n"
        "# Task placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS) + "\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)


def _section(doc: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise UserError(f"{source}: `{key}` must be a mapping")
    return value


def from_yaml(text: str, source: str = LAB_FILE) -> LabConfig:
    """Read tflab.yaml's text; a malformed file is a UserError naming what is wrong."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{source} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(doc, dict):
        raise UserError(f"{source} must be a mapping")
    topo = _section(doc, "topology", source)
    ports = _section(doc, "ports", source)
    image = _section(doc, "image", source)
    try:
        topology = Topology(
            nodes=int(topo.get("nodes", 1)),
            ps=int(topo["ps"]) if topo.get("ps") is not None else None,
            chief=bool(topo.get("chief", False)),
            evaluator=bool(topo.get("evaluator", False)),
            gpus_per_node=int(topo.get("gpus_per_node", 0)),
            share_gpus=bool(topo.get("share_gpus", False)),
            ssh_port_base=int(ports.get("ssh_base", 20022)),
            tensorboard_port_base=int(ports.get("tensorboard_base", 26006)),
            bind=str(ports.get("bind", "127.0.0.1")),
        )
        gpus = tuple(
            Gpu(index=int(g["index"]), name=str(g.get("name", "")), memory_mib=int(g.get("memory_mib", 0)))
            for g in doc.get("gpus") or []
        )
    except (TypeError, ValueError, KeyError) as exc:
        raise UserError(f"{source}: a topology, port or GPU value is not a number ({exc})") from exc
    data_mode = str(doc.get("data_mode", "copy"))
    if data_mode not in ("copy", "mount"):
        raise UserError(f"{source}: data_mode must be copy or mount, not {data_mode!r}")
    return LabConfig(
        name=str(doc.get("name") or "lab"),
        topology=topology,
        gpus=gpus,
        base_image=str(image.get("base", OFFICIAL_BASE)),
        code=doc.get("code"),
        data=doc.get("data"),
        data_mode=data_mode,
        runs=str(doc.get("runs") or DEFAULT_RUNS),
        shm_size=str(image.get("shm_size", "2g")),
        memlock=int(image.get("memlock", -1)),
        tasks=parse_tasks(doc.get("tasks"), source),
    )


def load(lab_dir: Path) -> LabConfig:
    """The lab in `lab_dir`, or a UserError saying there is none."""
    path = lab_dir / LAB_FILE
    if not path.is_file():
        raise UserError(f"no lab in {lab_dir} (no {LAB_FILE}); run `tflab gen` first or pass --lab DIR")
    return from_yaml(path.read_text(), str(path))


def code_tasks(code_dir: Path) -> dict[str, Task]:
    """Tasks a code folder brings in its own tflab.yaml (the examples do)."""
    path = code_dir / LAB_FILE
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    return parse_tasks(doc.get("tasks") if isinstance(doc, dict) else None, str(path))


def with_tasks(config: LabConfig, tasks: dict[str, Task]) -> LabConfig:
    """`config` with `tasks` added (existing names win)."""
    return replace(config, tasks={**tasks, **config.tasks})
