"""tflab.yaml, declared once: a pydantic model of its keys, where each lands in LabConfig, how it is written.

`LabFile` and its sections (`topology:`, `ports:` ...) list the file's keys in the order they are written, each
with its kind (plan/labvalues.py, plan/taskfile.py), its default, and `Lands`: the LabConfig attribute it
becomes and, where the attribute is not the value written, how it is written. Reading (`from_yaml`, strictly:
every error names the file and its key), writing (`to_yaml`) and the file's JSON Schema (`json_schema`, what
`tflab schema` prints and an editor checks the file with) all come from this one model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Annotated, Any

import yaml
from pydantic import Field

from tflab.errors import UserError
from tflab.plan import taskfile
from tflab.plan.config import (
    AUTO_BASE,
    DEFAULT_RUNS,
    LAB_FILE,
    PLACEHOLDERS,
    TARGETS,
    LabConfig,
    Packages,
    SwarmSettings,
)
from tflab.plan.labvalues import (
    AptPackages,
    CpuShare,
    GpuKeys,
    HostKeys,
    HostLabel,
    ImageRef,
    Json,
    Keras,
    LabName,
    LinkDelay,
    LinkRate,
    MemoryShare,
    PipPackages,
    Size,
    TensorFlowPin,
    Text,
    one_of,
    read_gpus,
    write_gpus,
    write_host,
)
from tflab.plan.links import Links
from tflab.plan.shares import AUTO
from tflab.plan.strictyaml import RETIRED, Keys, load_yaml, read_as, retired
from tflab.plan.taskfile import Tasks
from tflab.plan.topology import LOOPBACK, SSH_PORT_BASE, TENSORBOARD_PORT_BASE, Topology


@dataclass(frozen=True)
class Lands:
    """Where a key's value lands in LabConfig (`tasks`, `topology.nodes`), and its value in the file where that
    is not the attribute's."""

    attr: str
    write: Callable[[LabConfig], Any] | None = None
    read: Callable[[Any], Any] | None = None  # the file's value into the attribute's, where they differ

    def written(self, config: LabConfig) -> Any:
        return self.write(config) if self.write is not None else attrgetter(self.attr)(config)

    def value(self, read: Any) -> Any:
        return self.read(read) if self.read is not None else read


Port = Annotated[int, Field(ge=1, le=65535)]


class Section(Keys):
    """A mapping of keys of the file (`topology:`, `ports:` ...)."""

    @classmethod
    def written_for(cls, config: LabConfig) -> bool:
        """Whether the file has this section for `config` (every section but a swarm's has)."""
        return True


class TopologyKeys(Section):
    """The lab's nodes and their roles, and each node's share of the host."""

    nodes: Annotated[int, Field(ge=1, le=4096), Lands("topology.nodes")] = 1
    """How many nodes (machines) the lab has."""
    ps: Annotated[int | None, Field(ge=0), Lands("topology.ps", lambda c: c.topology.ps_count)] = None
    """Parameter servers among them (empty: one where the lab has more than one node)."""
    chief: Annotated[bool, Lands("topology.chief")] = False
    """A dedicated `chief` coordinator node."""
    evaluator: Annotated[bool, Lands("topology.evaluator")] = False
    """An `evaluator` node."""
    gpus_per_node: Annotated[int, Field(ge=0), Lands("topology.gpus_per_node")] = 0
    """The host's GPUs each node owns (0: a CPU lab)."""
    share_gpus: Annotated[bool, Lands("topology.share_gpus")] = False
    """Let several nodes share a GPU, each with a memory share."""
    cpus_per_node: Annotated[CpuShare, Lands("topology.cpus_per_node")] = AUTO
    """Each node's CPUs: auto (the host's split), 0 (no limit), or a number (0.5 for half of one)."""
    memory_per_node: Annotated[MemoryShare, Lands("topology.memory_per_node")] = AUTO
    """Each node's memory: auto (the host's split), 0 (no limit), or a size such as 4g."""


class PortsKeys(Section):
    """Where the host publishes each node's SSH and TensorBoard."""

    ssh_base: Annotated[Port, Lands("topology.ssh_port_base")] = SSH_PORT_BASE
    """The host's port of the first node's SSH; the next nodes take the next ports."""
    tensorboard_base: Annotated[Port, Lands("topology.tensorboard_port_base")] = TENSORBOARD_PORT_BASE
    """The host's port of the first node's TensorBoard; the next nodes take the next ports."""
    bind: Annotated[Text, Lands("topology.bind")] = LOOPBACK
    """The host's address the ports are published on (0.0.0.0: every interface)."""


class ImageKeys(Section):
    """The image every node runs."""

    base: Annotated[ImageRef | None, Lands("base_image")] = AUTO_BASE
    """The base image: auto (the official TensorFlow image where a registry answers, else tflab's own), official,
    local, or an image's name."""
    tensorflow: Annotated[TensorFlowPin | None, Lands("tensorflow")] = None
    """A TensorFlow version to pin, such as '2.15.0' (empty: the base's own)."""
    keras: Annotated[Keras | None, Lands("keras")] = None
    """2: Keras 2 (tf-keras) on today's TensorFlow, for programs written for it (empty: the TensorFlow's own Keras)."""
    shm_size: Annotated[Size | None, Lands("shm_size")] = "2g"
    """Shared memory (/dev/shm) of each node, such as 2g."""
    memlock: Annotated[int | None, Field(ge=-1), Lands("memlock")] = None
    """Each node's locked-memory limit in bytes (-1: unlimited, as RDMA needs; empty: Docker's)."""


class PackagesKeys(Section):
    """What the image adds to its base."""

    pip: Annotated[PipPackages | None, Lands("packages.pip", lambda c: list(c.packages.pip))] = ()
    """pip requirements (pandas, numpy<2), or -r FILE of the code folder."""
    apt: Annotated[AptPackages | None, Lands("packages.apt", lambda c: list(c.packages.apt))] = ()
    """Debian/Ubuntu packages (libsndfile1)."""


class LinksKeys(Section):
    """The links between nodes: a rate and a delay, as a cluster's network has."""

    rate: Annotated[LinkRate | None, Lands("links.rate")] = None
    """Every node's link shaped to this rate (100mbit, 1gbit, 10gbit; empty: not shaped)."""
    delay_ms: Annotated[LinkDelay | None, Lands("links.delay_ms")] = None
    """A one-way delay in milliseconds added to every node's link (empty or 0: none)."""


class SwarmKeys(Section):
    """A swarm lab's placement of nodes on hosts, and the registry its image is pushed to."""

    @classmethod
    def written_for(cls, config: LabConfig) -> bool:
        return config.target == "swarm"

    place: Annotated[dict[str, HostLabel] | None, Lands("swarm.place", lambda c: dict(c.swarm.place))] = {}
    """Which swarm node each node runs on: NODE: HOST runs NODE on the swarm node labelled tflab.host=HOST."""
    registry: Annotated[Text | None, Lands("swarm.registry")] = None
    """The registry `tflab build` pushes the node image to (needed on several hosts)."""


class LabFile(Keys):
    """A tflab lab: its topology, image, links and tasks (`tflab gen` writes it; `tflab up` reads it)."""

    name: Annotated[LabName | None, Lands("name")] = "lab"
    """The lab's name (one line)."""
    target: Annotated[one_of(*TARGETS) | None, Lands("target")] = "compose"  # type: ignore[valid-type]
    """Where the lab runs: compose (this host) or swarm (an existing Docker Swarm)."""
    topology: TopologyKeys | None = None
    gpus: Annotated[list[GpuKeys] | None, Lands("gpus", write_gpus, read_gpus)] = []
    """The host's GPUs, as `gen` found them (nvidia-smi)."""
    host: Annotated[HostKeys | None, Lands("host", write_host, HostKeys.facts)] = Field(default_factory=HostKeys)
    ports: PortsKeys | None = None
    image: ImageKeys | None = None
    packages: PackagesKeys | None = None
    links: LinksKeys | None = None
    faults: Annotated[bool, Lands("faults")] = False
    """Let `tflab fault` and drills slow or cut off nodes' traffic (the nodes get NET_ADMIN)."""
    swarm: SwarmKeys | None = None
    code: Annotated[Text | None, Lands("code")] = None
    """The folder copied to each node's /workspace (relative to the lab)."""
    data: Annotated[Text | None, Lands("data")] = None
    """The folder made available at /data (relative to the lab)."""
    data_mode: Annotated[one_of("copy", "mount") | None, Lands("data_mode")] = "copy"  # type: ignore[valid-type]
    """copy the data into each node, or mount it read-only."""
    runs: Annotated[Text | None, Lands("runs")] = DEFAULT_RUNS
    """The host folder shared by every node at /runs."""
    warm: Annotated[bool | None, RETIRED] = None
    """Retired: read and ignored (every program starts cold, as on a cluster's machine); never written."""
    tasks: Annotated[Tasks | None, Lands("tasks", lambda c: taskfile.dump_tasks(c.tasks), taskfile.tasks_of)] = {}
    """Named command lines: `tflab run NAME` runs one on every node, in order."""


TOP_KEYS = tuple(LabFile.model_fields)
# The LabConfig attributes that are objects of their own: `topology.nodes` is Topology's `nodes`.
PARTS: dict[str, Callable[..., Any]] = {"topology": Topology, "links": Links, "swarm": SwarmSettings,
                                        "packages": Packages}


def sections() -> dict[str, type[Section]]:
    """The file's sections by key: `topology` -> TopologyKeys."""
    return {name: kind for name, field in LabFile.model_fields.items()
            for kind in _args(field.annotation) if isinstance(kind, type) and issubclass(kind, Section)}


def lands(model: type[Keys]) -> dict[str, Lands]:
    """Each key of `model` (not a section) and where it lands."""
    return {name: next(m for m in field.metadata if isinstance(m, Lands))
            for name, field in model.model_fields.items() if any(isinstance(m, Lands) for m in field.metadata)}


def _args(annotation: Any) -> tuple[Any, ...]:
    return getattr(annotation, "__args__", (annotation,))


SCHEMA_FILE = "tflab.schema.json"  # beside tflab.yaml, which names it for an editor (its first line)
MODELINE = f"# yaml-language-server: $schema={SCHEMA_FILE}"


def json_schema() -> Json:
    """tflab.yaml's JSON Schema, from the model: what `tflab schema` prints and `gen` writes beside the file."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **LabFile.model_json_schema(),
            "title": "tflab.yaml"}


def from_yaml(text: str, source: str = LAB_FILE) -> LabConfig:
    """Read tflab.yaml's text; anything malformed is a UserError naming its key."""
    doc = load_yaml(text, source)
    if doc is None:
        raise UserError(f"{source} is empty: a lab's file names its topology at least; `tflab gen` writes one")
    if not isinstance(doc, dict):
        raise UserError(f"{source} must be a mapping of keys ({', '.join(TOP_KEYS)})")
    lab = read_as(LabFile, doc, source)
    values: dict[str, Any] = {}
    for name, kind in sections().items():
        part = getattr(lab, name) or kind()
        values.update({where.attr: where.value(getattr(part, key)) for key, where in lands(kind).items()})
    values.update({where.attr: where.value(getattr(lab, key)) for key, where in lands(LabFile).items()})
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
    for attr, value in values.items():
        head, _, rest = attr.partition(".")
        if rest:
            parts[head][rest] = value
        else:
            top[attr] = value
    return LabConfig(**top, **{name: PARTS[name](**kwargs) for name, kwargs in parts.items()})


RETIRED_NOTE = ("tflab: note: {keys} in {source} no longer {does} anything: every program starts cold, as on a "
                "cluster's machine (remove {them} to silence this note)")


def retired_keys(text: str) -> list[str]:
    """The retired keys a (valid) tflab.yaml still names: `warm`, and `tasks.NAME.preload` (an earlier tflab's warm
    interpreter and preload). They are read and ignored."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        return []
    found = [key for key in retired(LabFile) if key in doc]
    tasks = doc.get("tasks") or {}
    if isinstance(tasks, dict):
        found += [f"tasks.{name}.{key}" for name, spec in tasks.items() if isinstance(spec, dict)
                  for key in retired(taskfile.TaskKeys) if key in spec]
    return found


def to_yaml(config: LabConfig) -> str:
    """tflab.yaml's text for `config`."""
    doc: dict[str, Any] = {}
    kinds = sections()
    top = lands(LabFile)
    for name in TOP_KEYS:
        if name in kinds:
            kind = kinds[name]
            if kind.written_for(config):
                doc[name] = {key: where.written(config) for key, where in lands(kind).items()}
        elif name in top:
            doc[name] = top[name].written(config)
    header = (f"{MODELINE}\n# tflab lab: edit it, then run `tflab up` again.\n"
              "# Task placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS) + "\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)
