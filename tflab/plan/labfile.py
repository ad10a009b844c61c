"""tflab.yaml's schema, described once: every key, where it lands in LabConfig, how it is read and written.

`SCHEMA` lists the file's entries in the order they are written. Each `Key` names its place in the
file, the LabConfig attribute it becomes, the reader of its kind (plan/labvalues.py: strictly, every
error names its key, and what it may hold as JSON Schema says it) and, where the attribute is not the
value written, how it is written. The allowed keys of each mapping, the reading (`from_yaml`), the
writing (`to_yaml`) and the file's JSON Schema (`json_schema`) all come from this one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import yaml

from tflab.errors import UserError
from tflab.plan import shares, taskfile
from tflab.plan.config import (
    AUTO_BASE,
    DEFAULT_RUNS,
    LAB_FILE,
    PLACEHOLDERS,
    TARGETS,
    LabConfig,
    Packages,
    SwarmSettings,
    check_apt,
    check_image_ref,
    check_one_line,
    check_pip,
)
from tflab.plan.labvalues import (
    Json,
    Reads,
    ReadKey,
    boolean,
    gpus,
    host,
    integer,
    keras,
    link_delay,
    link_rate,
    package_list,
    path,
    placement,
    share,
    string,
    tasks,
    tensorflow,
    text,
    whole,
    write_gpus,
    write_host,
)
from tflab.plan.links import Links
from tflab.plan.strictyaml import Reader, load_yaml
from tflab.plan.topology import LOOPBACK, SSH_PORT_BASE, TENSORBOARD_PORT_BASE, Topology


@dataclass(frozen=True)
class Key:
    """One key of tflab.yaml."""

    name: str
    attr: str  # where its value lands in LabConfig: "tasks", "topology.nodes", "links.rate"
    read: ReadKey
    write: Callable[[LabConfig], Any] | None = None  # its value in the file (default: the attribute's)

    def written(self, config: LabConfig) -> Any:
        return self.write(config) if self.write is not None else attrgetter(self.attr)(config)

    @property
    def schema(self) -> Json:
        return self.read.schema if isinstance(self.read, Reads) else {}


@dataclass(frozen=True)
class Section:
    """A mapping of keys (`topology:`, `ports:` ...), written when `when` says so."""

    name: str
    keys: tuple[Key, ...]
    when: Callable[[LabConfig], bool] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(key.name for key in self.keys)


# -- the schema ------------------------------------------------------------------------------------

SCHEMA: tuple[Key | Section, ...] = (
    Key("name", "name", string("lab", check=check_one_line)),
    Key("target", "target", string("compose", choices=TARGETS)),
    Section("topology", (
        Key("nodes", "topology.nodes", whole(1, minimum=1, maximum=4096)),
        Key("ps", "topology.ps", integer(None, minimum=0), write=lambda c: c.topology.ps_count),
        Key("chief", "topology.chief", boolean(False)),
        Key("evaluator", "topology.evaluator", boolean(False)),
        Key("gpus_per_node", "topology.gpus_per_node", whole(0, minimum=0)),
        Key("share_gpus", "topology.share_gpus", boolean(False)),
        Key("cpus_per_node", "topology.cpus_per_node", share(shares.check_cpu_choice)),
        Key("memory_per_node", "topology.memory_per_node", share(shares.check_memory_choice)),
    )),
    Key("gpus", "gpus", gpus, write=write_gpus),
    Key("host", "host", host, write=write_host),
    Section("ports", (
        Key("ssh_base", "topology.ssh_port_base", whole(SSH_PORT_BASE, minimum=1, maximum=65535)),
        Key("tensorboard_base", "topology.tensorboard_port_base", whole(TENSORBOARD_PORT_BASE, minimum=1, maximum=65535)),
        Key("bind", "topology.bind", text(LOOPBACK)),
    )),
    Section("image", (
        Key("base", "base_image", string(AUTO_BASE, check=check_image_ref)),
        Key("tensorflow", "tensorflow", tensorflow),
        Key("keras", "keras", keras),
        Key("shm_size", "shm_size", string("2g", check=shares.size_bytes)),
        Key("memlock", "memlock", integer(None, minimum=-1)),
    )),
    Section("packages", (
        Key("pip", "packages.pip", package_list(check_pip), write=lambda c: list(c.packages.pip)),
        Key("apt", "packages.apt", package_list(check_apt), write=lambda c: list(c.packages.apt)),
    )),
    Section("links", (
        Key("rate", "links.rate", link_rate),
        Key("delay_ms", "links.delay_ms", link_delay),
    )),
    Key("faults", "faults", boolean(False)),
    Section("swarm", (
        Key("place", "swarm.place", placement, write=lambda c: dict(c.swarm.place)),
        Key("registry", "swarm.registry", string(None)),
    ), when=lambda c: c.target == "swarm"),
    Key("code", "code", path(None)),
    Key("data", "data", path(None)),
    Key("data_mode", "data_mode", string("copy", choices=("copy", "mount"))),
    Key("runs", "runs", path(DEFAULT_RUNS)),
    Key("warm", "warm", boolean(True)),
    Key("tasks", "tasks", tasks, write=lambda c: taskfile.dump_tasks(c.tasks)),
)
TOP_KEYS = tuple(entry.name for entry in SCHEMA)
# The LabConfig attributes that are objects of their own: `topology.nodes` is Topology's `nodes`.
PARTS: dict[str, Callable[..., Any]] = {"topology": Topology, "links": Links, "swarm": SwarmSettings,
                                        "packages": Packages}


SCHEMA_FILE = "tflab.schema.json"  # beside tflab.yaml, which names it for an editor (its first line)
MODELINE = f"# yaml-language-server: $schema={SCHEMA_FILE}"


def json_schema() -> Json:
    """tflab.yaml's JSON Schema, from SCHEMA: what `tflab schema` prints and `gen` writes beside the file."""
    def section(keys: tuple[Key, ...]) -> Json:
        return {"type": ["object", "null"], "additionalProperties": False,
                "properties": {key.name: key.schema for key in keys}}

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "tflab.yaml",
            "description": "A tflab lab: its topology, image, links and tasks (`tflab gen` writes it; `tflab up` reads it)",
            "type": "object", "additionalProperties": False,
            "properties": {entry.name: section(entry.keys) if isinstance(entry, Section) else entry.schema
                           for entry in SCHEMA}}


def from_yaml(text: str, source: str = LAB_FILE) -> LabConfig:
    """Read tflab.yaml's text; anything malformed is a UserError naming its key."""
    doc = load_yaml(text, source)
    read = Reader(source)
    if doc is None:
        raise UserError(f"{source} is empty: a lab's file names its topology at least; `tflab gen` writes one")
    if not isinstance(doc, dict):
        raise UserError(f"{source} must be a mapping of keys ({', '.join(TOP_KEYS)})")
    doc = read.mapping(doc, "(top level)", TOP_KEYS)
    values: dict[str, Any] = {}
    for entry in SCHEMA:
        if isinstance(entry, Section):
            part = read.mapping(doc.get(entry.name), entry.name, entry.names)
            for key in entry.keys:
                values[key.attr] = key.read(read, part, key.name, entry.name)
        else:
            values[entry.attr] = entry.read(read, doc, entry.name, "")
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
    for attr, value in values.items():
        head, _, rest = attr.partition(".")
        if rest:
            parts[head][rest] = value
        else:
            top[attr] = value
    return LabConfig(**top, **{name: PARTS[name](**kwargs) for name, kwargs in parts.items()})


def to_yaml(config: LabConfig) -> str:
    """tflab.yaml's text for `config`."""
    doc: dict[str, Any] = {}
    for entry in SCHEMA:
        if isinstance(entry, Section):
            if entry.when is None or entry.when(config):
                doc[entry.name] = {key.name: key.written(config) for key in entry.keys}
        else:
            doc[entry.name] = entry.written(config)
    header = (f"{MODELINE}\n# tflab lab: edit it, then run `tflab up` again.\n"
              "# Task placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS) + "\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)
