"""tflab.yaml: the lab's single source of truth, read (strictly) and written here."""

from __future__ import annotations

import re
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from tflab.errors import UserError
from tflab.plan import links as link_rules
from tflab.plan import machines, progress
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.machines import HostFacts
from tflab.plan.topology import (
    LOOPBACK,
    SSH_PORT_BASE,
    TENSORBOARD_PORT_BASE,
    Topology,
)

LAB_FILE = "tflab.yaml"
COMPOSE_FILE = "docker-compose.yml"
STACK_FILE = "docker-stack.yml"
IMAGE_DIR = "image"
KEYS_DIR = "keys"
PRIVATE_KEY = "id_ed25519"  # the lab key pair's file names in KEYS_DIR
PUBLIC_KEY = "id_ed25519.pub"
CODE_DIR = "code"
DATA_DIR = "data"
DEFAULT_RUNS = "runs"
# A task's `batch:`: examples per step, a number or an --env knob's {NAME}, "per worker" where each worker's
# step takes that many (synchronous all-reduce: the global batch grows with the workers).
BATCH = re.compile(r"^(?:[1-9][0-9]*|\{[A-Za-z_][A-Za-z0-9_]*\})(?: per worker)?$")
PLACEHOLDERS = ("node", "job_name", "task_index", "ps_hosts", "worker_hosts", "num_gpus", "run_dir")
ROLES = ("ps", "worker", "chief", "evaluator")
DEFAULT_SERVERS = ("ps",)
TARGETS = ("compose", "swarm")
AUTO_BASE = "auto"
OFFICIAL_BASE = "tensorflow/tensorflow:2.18.0"
OFFICIAL_GPU_BASE = "tensorflow/tensorflow:2.18.0-gpu"
LOCAL_BASE = "tflab-base:cpu"
LOCAL_GPU_BASE = "tflab-base:gpu"


def official_base(has_gpus: bool, tensorflow: str | None = None) -> str:
    """The official TensorFlow image for a lab (its GPU variant when the lab has GPUs; a pinned version's)."""
    if tensorflow:
        return f"tensorflow/tensorflow:{tensorflow}{'-gpu' if has_gpus else ''}"
    return OFFICIAL_GPU_BASE if has_gpus else OFFICIAL_BASE


def local_base(has_gpus: bool, tensorflow: str | None = None) -> str:
    """The base `tflab base` builds for a lab (`--gpu` when the lab has GPUs; a pinned version its own tag)."""
    if tensorflow:
        return f"{LOCAL_GPU_BASE if has_gpus else LOCAL_BASE}-tf{tensorflow}"
    return LOCAL_GPU_BASE if has_gpus else LOCAL_BASE


def tensorflow_requirement(has_gpus: bool, tensorflow: str | None = None) -> str:
    """What pip installs into tflab's own base: TensorFlow (the pinned version, where the lab pins one)."""
    package = "tensorflow[and-cuda]" if has_gpus else "tensorflow-cpu"
    if not tensorflow:
        return package
    return f"{package}=={tensorflow}.*" if tensorflow.count(".") == 1 else f"{package}=={tensorflow}"


def pick_release(version: str, available: list[str]) -> str | None:
    """The release of `available` a pinned version means (`2.15` the newest 2.15.x), or None."""
    if version.count(".") == 2:
        return version if version in available else None
    matching = [v for v in available if v.startswith(version + ".")]
    return matching[0] if matching else None


def base_name(choice: str, has_gpus: bool, tensorflow: str | None = None) -> str:
    """The image `image.base` names: `official` and `local` by their names, `auto` as the official one
    (what a Dockerfile built by hand gets; `up` decides `auto` against the registry), else itself."""
    if choice in (AUTO_BASE, "official"):
        return official_base(has_gpus, tensorflow)
    if choice == "local":
        return local_base(has_gpus, tensorflow)
    return choice


# TensorFlow releases and the Pythons their wheels are built for (pypi.org's files of tensorflow-cpu).
TENSORFLOW_PYTHONS: dict[str, tuple[int, int]] = {
    "2.8": (7, 10), "2.9": (7, 10), "2.10": (7, 10), "2.11": (7, 10), "2.12": (8, 11), "2.13": (8, 11),
    "2.14": (9, 11), "2.15": (9, 11), "2.16": (9, 12), "2.17": (9, 12), "2.18": (9, 12), "2.19": (9, 12),
    "2.20": (9, 13), "2.21": (10, 13),
}
TF_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def check_tensorflow(version: str, python: tuple[int, int] | None = None, where: str = "") -> str:
    """A TensorFlow version to pin (`2.15`, `2.15.1`); with the base's `python`, one whose wheels fit it."""
    match = TF_VERSION.fullmatch(version)
    if not match:
        raise UserError(f"--tensorflow {version!r} is not a TensorFlow version (such as 2.15.0)")
    release = f"{match.group(1)}.{match.group(2)}"
    if python is not None and release in TENSORFLOW_PYTHONS:
        low, high = TENSORFLOW_PYTHONS[release]
        if python[0] == 3 and not low <= python[1] <= high:
            fits = [r for r, (lo, hi) in TENSORFLOW_PYTHONS.items() if lo <= python[1] <= hi]
            raise UserError(f"TensorFlow {version} has no wheels for Python {python[0]}.{python[1]}{where} (it "
                            f"supports 3.{low} to 3.{high}): pick {fits[0]} to {fits[-1]} there, or another base")
    return version


@dataclass(frozen=True)
class Packages:
    """What a lab's code needs beyond TensorFlow: pip requirements and Debian/Ubuntu packages."""

    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pip or self.apt)

    @property
    def requirements_files(self) -> tuple[str, ...]:
        """The `-r FILE` entries: files of the code folder, read at build time."""
        return tuple(spec.split(None, 1)[1] for spec in self.pip if spec.startswith("-r "))


REQUIREMENTS = "requirements.txt"
PIP_SPEC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,. -]+\])?"
                      r"(\s*(===|==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+(\s*,\s*(===|==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+)*)?"
                      r"(\s*@\s*[A-Za-z0-9+.-]+://[^\s;]+)?(\s*;\s*[A-Za-z0-9_.<>=!~'\" ()-]+)?")
APT_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?")


def check_pip(spec: str, what: str = "--pip") -> str:
    """A pip requirement specifier (`pandas`, `numpy<2`, `tokenizers==0.15.2`), or `-r FILE` of the code folder."""
    text = str(spec).strip()
    if text.startswith("-r"):
        path = text[2:].strip()
        if not path or path.startswith("/") or ".." in Path(path).parts or CONTROL.search(path):
            raise UserError(f"{what} {spec!r}: -r names a requirements file inside the code folder, "
                            "such as -r requirements.txt")
        return f"-r {path}"
    if CONTROL.search(text) or len(text) > 300 or not PIP_SPEC.fullmatch(text):
        raise UserError(f"{what} {spec!r} is not a pip requirement (such as pandas, numpy<2 or "
                        "tokenizers==0.15.2), nor -r FILE")
    return text


def check_apt(name: str, what: str = "--apt") -> str:
    """A Debian/Ubuntu package name (`libsndfile1`, `graphviz=2.42.2-7`)."""
    if not APT_NAME.fullmatch(str(name)):
        raise UserError(f"{what} {name!r} is not a Debian/Ubuntu package name (such as libsndfile1)")
    return str(name)


TASK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# A Docker image reference: [registry[:port]/]path[:tag][@digest], lower-case path components.
IMAGE_REF = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::\d+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                       r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                       r"(?:@sha256:[0-9a-f]{64})?")
HOST_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # a swarm node's `tflab.host` label
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_image_ref(value: str, what: str) -> str:
    """An image name as Docker reads it (the keywords auto, official and local aside)."""
    if value not in (AUTO_BASE, "official", "local") and (len(value) > 255 or not IMAGE_REF.fullmatch(value)):
        raise UserError(f"{what} {value!r} is not an image name (like tensorflow/tensorflow:2.15.0 or "
                        "registry:5000/team/tf:1)")
    return value


def check_host_label(value: str, what: str) -> str:
    """A swarm host's name as `--place` and `swarm.place` give it: a word (it becomes a label and a constraint)."""
    if not HOST_LABEL.fullmatch(value):
        raise UserError(f"{what} {value!r} is not a host name: use letters, digits, _, . and -")
    return value


EVERY_INTERFACE = ("0.0.0.0", "::")


def check_swarm_bind(bind: str) -> None:
    """A swarm publishes a node's ports on every interface of the host it runs on (mode host; it takes no
    address): a swarm lab says so with `--bind 0.0.0.0`, or is refused rather than exposed unasked."""
    if bind not in EVERY_INTERFACE:
        raise UserError(f"a swarm lab cannot publish on {bind}: Swarm publishes each node's SSH (key only) and "
                        "TensorBoard (no login) on every interface of the host it runs on; pass --bind 0.0.0.0 "
                        "to accept that (and firewall those ports), or use a compose lab")


def check_one_line(value: str, what: str) -> str:
    """A text tflab writes into files' comments and names: one line, no control characters, at most 100."""
    if CONTROL.search(value) or len(value) > 100:
        raise UserError(f"{what} {value!r} must be one line of at most 100 characters, without control characters")
    return value


def check_task_name(name: str, source: str = "task") -> str:
    """A task name is a word: letters, digits, `_`, `.`, `-`, not starting with `.`."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name) or len(name) > 64:
        raise UserError(
            f"{source} name {name!r} is not a word: use letters, digits, _, . and - "
            "(not starting with .), at most 64 characters"
        )
    return name


@dataclass(frozen=True)
class Task:
    """A named command of tflab.yaml, and the roles that only serve while it runs."""

    name: str
    command: str
    servers: tuple[str, ...] = DEFAULT_SERVERS
    # Start the workers' Python and TensorFlow while the servers start (the guard's preload).
    preload: bool = True
    # How the program says its step, where tflab's own reading does not know its lines (a regex
    # with a named group `step` or `rate`).
    progress: str | None = None
    # Examples one step of the cluster's steps/s consumes (its global batch), so runs and sweeps
    # can say examples/s: a number, or `{NAME}` for a run's `--env NAME=...` knob.
    batch: str | None = None


@dataclass(frozen=True)
class SwarmSettings:
    """Where a swarm lab's nodes run and where its image is pushed."""

    place: dict[str, str] = field(default_factory=dict)  # node -> swarm node label tflab.host
    registry: str | None = None


@dataclass(frozen=True)
class LabConfig:
    """Everything tflab.yaml holds."""

    name: str
    topology: Topology
    gpus: tuple[Gpu, ...] = ()
    host: HostFacts = HostFacts()  # the host's CPUs and memory, as the split saw them at gen
    base_image: str = AUTO_BASE
    code: str | None = None
    data: str | None = None
    data_mode: str = "copy"  # copy | mount
    runs: str = DEFAULT_RUNS
    shm_size: str = "2g"
    memlock: int | None = None  # bytes of locked memory a node may use; -1 unlimited; None: the engine's
    tasks: dict[str, Task] = field(default_factory=dict)
    target: str = "compose"  # compose | swarm
    # One TensorFlow interpreter kept ready in each node (made at `up` and after each run),
    # so a run's processes do not pay the import; about 0.5 GB of memory per node.
    warm: bool = True
    links: Links = Links()
    swarm: SwarmSettings = SwarmSettings()
    # Nodes may be slowed or cut off on purpose (`tflab fault`, drills): they get NET_ADMIN.
    faults: bool = False
    packages: Packages = Packages()  # installed into the node image, on top of its base
    tensorflow: str | None = None  # the TensorFlow version pinned (None: the base's own)

    @property
    def net_admin(self) -> bool:
        """Whether the nodes get NET_ADMIN: shaped links, or faults on purpose."""
        return bool(self.links) or self.faults

    def task(self, name: str) -> Task:
        """The task called `name`, or a UserError naming the tasks there are."""
        check_task_name(name)
        if name not in self.tasks:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UserError(f"no task {name!r} in {LAB_FILE}; its tasks are: {known}")
        return self.tasks[name]

    @property
    def has_gpus(self) -> bool:
        """Whether the lab's nodes own GPUs."""
        return self.topology.gpus_per_node > 0


def fill_placeholders(command: str, values: dict[str, str]) -> str:
    """Put a node's values in `{node}`-style placeholders; other braces are left alone."""
    pattern = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], command)


# -- strict reading ----------------------------------------------------------------------------


class _Reader:
    """Reads one document strictly: unknown keys and wrongly typed values name their key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, message: str) -> UserError:
        return UserError(f"{self.source}: {key} {message}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, not {_shown(value)}")
        for name in value:
            if not isinstance(name, str):
                raise self.fail(key, f"has a key that is not a word: {name!r}")
            if allowed is not None and name not in allowed:
                hint = _closest(name, allowed)
                raise self.fail(
                    f"{key}.{name}" if key != "(top level)" else name,
                    f"is not a key tflab knows{hint}; the keys here are: {', '.join(allowed)}",
                )
        return value

    def integer(self, doc: dict, key: str, where: str, default: int | None,
                minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = doc.get(key, default)
        name = f"{where}.{key}" if where else key
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be a whole number, not {_shown(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise self.fail(name, f"must be at most {maximum}, not {value}")
        return value

    def whole(self, doc: dict, key: str, where: str, default: int, minimum: int | None = None,
              maximum: int | None = None) -> int:
        """A whole number that must be there (null is refused, not taken for the default)."""
        value = self.integer(doc, key, where, default, minimum, maximum)
        if value is None:
            raise self.fail(f"{where}.{key}" if where else key, "must be a whole number, not null")
        return value

    def text(self, doc: dict, key: str, where: str, default: str) -> str:
        """A text that must be there (null is refused, not taken for the default)."""
        value = self.string(doc, key, where, default)
        if value is None:
            raise self.fail(f"{where}.{key}" if where else key, "must be a text, not null")
        return value

    def boolean(self, doc: dict, key: str, where: str, default: bool) -> bool:
        value = doc.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{where}.{key}" if where else key, f"must be true or false, not {_shown(value)}")
        return value

    def string(self, doc: dict, key: str, where: str, default: str | None,
               choices: tuple[str, ...] | None = None) -> str | None:
        value = doc.get(key, default)
        name = f"{where}.{key}" if where else key
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a text, not {_shown(value)}")
        if choices is not None and value not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"


def _closest(name: str, allowed: tuple[str, ...]) -> str:
    import difflib

    match = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {match[0]}?)" if match else ""


TOP_KEYS = ("name", "target", "topology", "gpus", "host", "ports", "image", "packages", "links", "faults", "swarm",
            "code", "data", "data_mode", "runs", "warm", "tasks")
TOPOLOGY_KEYS = ("nodes", "ps", "chief", "evaluator", "gpus_per_node", "share_gpus", "cpus_per_node",
                 "memory_per_node")
HOST_KEYS = ("cpus", "numa", "gpu_numa", "memory_mib")
GPU_KEYS = ("index", "uuid", "name", "memory_mib")
PORT_KEYS = ("ssh_base", "tensorboard_base", "bind")
IMAGE_KEYS = ("base", "tensorflow", "shm_size", "memlock")
PACKAGE_KEYS = ("pip", "apt")
LINK_KEYS = ("rate", "delay_ms")
SWARM_KEYS = ("place", "registry")
TASK_KEYS = ("command", "servers", "preload", "progress", "batch")


def parse_tasks(raw: Any, source: str) -> dict[str, Task]:
    """Tasks as tflab.yaml writes them: `name: command` or `name: {command:, servers:, preload:}`."""
    read = _Reader(source)
    tasks: dict[str, Task] = {}
    for name, spec in read.mapping(raw, "tasks").items():
        check_task_name(name, f"{source}: task")
        where = f"tasks.{name}"
        if isinstance(spec, str):
            if not spec.strip():
                raise read.fail(where, "needs a command")
            tasks[name] = Task(name, spec)
            continue
        if not isinstance(spec, dict):
            raise read.fail(where, f"needs a command (a text, or a mapping with `command`), not {_shown(spec)}")
        spec = read.mapping(spec, where, TASK_KEYS)
        command = read.string(spec, "command", where, None)
        if command is None:
            raise read.fail(where, "needs a command")
        servers = spec.get("servers", list(DEFAULT_SERVERS))
        if not isinstance(servers, list) or not all(isinstance(s, str) and s in ROLES for s in servers):
            raise read.fail(f"{where}.servers", f"lists roles ({', '.join(ROLES)}), not {servers!r}")
        preload = read.boolean(spec, "preload", where, True)
        pattern = read.string(spec, "progress", where, None)
        if pattern is not None:
            try:
                progress.check_pattern(pattern)
            except ValueError as exc:
                raise read.fail(f"{where}.progress", str(exc)) from None
        batch = spec.get("batch")
        if batch is not None:
            if isinstance(batch, bool) or not (isinstance(batch, int) and batch > 0
                                               or isinstance(batch, str) and BATCH.match(batch.strip())):
                raise read.fail(f"{where}.batch", "must be the examples one step takes: a whole number or {NAME} "
                                                  f"(a --env knob), optionally 'per worker'; not {_shown(batch)}")
            batch = str(batch).strip()
        tasks[name] = Task(name, command, tuple(servers), preload, pattern, batch)
    return tasks


def dump_tasks(tasks: dict[str, Task]) -> dict[str, Any]:
    """Tasks back into their tflab.yaml form (the short form when it says everything)."""
    out: dict[str, Any] = {}
    for name, task in tasks.items():
        if task.servers == DEFAULT_SERVERS and task.preload and task.progress is None and task.batch is None:
            out[name] = task.command
        else:
            spec: dict[str, Any] = {"command": task.command}
            if task.servers != DEFAULT_SERVERS:
                spec["servers"] = list(task.servers)
            if not task.preload:
                spec["preload"] = False
            if task.progress is not None:
                spec["progress"] = task.progress
            if task.batch is not None:
                spec["batch"] = int(task.batch) if task.batch.isdigit() else task.batch
            out[name] = spec
    return out


def to_yaml(config: LabConfig) -> str:
    """tflab.yaml's text for `config`."""
    t = config.topology
    doc: dict[str, Any] = {
        "name": config.name,
        "target": config.target,
        "topology": {
            "nodes": t.nodes,
            "ps": t.ps_count,
            "chief": t.chief,
            "evaluator": t.evaluator,
            "gpus_per_node": t.gpus_per_node,
            "share_gpus": t.share_gpus,
            "cpus_per_node": t.cpus_per_node,
            "memory_per_node": t.memory_per_node,
        },
        "gpus": [
            {k: v for k, v in (("index", g.index), ("name", g.name), ("memory_mib", g.memory_mib)) if v or k == "index"}
            for g in config.gpus
        ],
        "host": host_to_yaml(config.host),
        "ports": {
            "ssh_base": t.ssh_port_base,
            "tensorboard_base": t.tensorboard_port_base,
            "bind": t.bind,
        },
        "image": {"base": config.base_image, "tensorflow": config.tensorflow, "shm_size": config.shm_size,
                  "memlock": config.memlock},
        "packages": {"pip": list(config.packages.pip), "apt": list(config.packages.apt)},
        "links": {"rate": config.links.rate, "delay_ms": config.links.delay_ms},
        "faults": config.faults,
        "code": config.code,
        "data": config.data,
        "data_mode": config.data_mode,
        "runs": config.runs,
        "warm": config.warm,
        "tasks": dump_tasks(config.tasks),
    }
    if config.target == "swarm":
        doc["swarm"] = {"place": dict(config.swarm.place), "registry": config.swarm.registry}
    header = (
        "# tflab lab: edit it, then run `tflab up` again.\n"
        "# Task placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS) + "\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)


class _StrictLoader(yaml.SafeLoader):
    """YAML as written by a person: a key given twice is a mistake to show, not a value to drop."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}): keep one", key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader says so itself
                break
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)  # type: ignore[type-var]


def load_yaml(text: str, source: str) -> Any:
    """A YAML file a person edits, strictly: malformed text or a key given twice is a UserError naming the file."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.constructor.ConstructorError as exc:
        if exc.problem and "given twice" in exc.problem:
            raise UserError(f"{source}: {exc.problem}") from None
        raise UserError(f"{source} is not valid YAML: {' '.join(str(exc).split())[:200]}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source} is not valid YAML: {' '.join(str(exc).split())[:200]}") from None


def from_yaml(text: str, source: str = LAB_FILE) -> LabConfig:
    """Read tflab.yaml's text; anything malformed is a UserError naming its key."""
    doc = load_yaml(text, source)
    read = _Reader(source)
    if doc is None:
        raise UserError(f"{source} is empty: a lab's file names its topology at least; "
                        "`tflab gen` writes one")
    if not isinstance(doc, dict):
        raise UserError(f"{source} must be a mapping of keys ({', '.join(TOP_KEYS)})")
    doc = read.mapping(doc, "(top level)", TOP_KEYS)
    topo = read.mapping(doc.get("topology"), "topology", TOPOLOGY_KEYS)
    ports = read.mapping(doc.get("ports"), "ports", PORT_KEYS)
    image = read.mapping(doc.get("image"), "image", IMAGE_KEYS)
    link = read.mapping(doc.get("links"), "links", LINK_KEYS)
    swarm = read.mapping(doc.get("swarm"), "swarm", SWARM_KEYS)

    topology = Topology(
        nodes=read.whole(topo, "nodes", "topology", 1, minimum=1, maximum=4096),
        ps=read.integer(topo, "ps", "topology", None, minimum=0),
        chief=read.boolean(topo, "chief", "topology", False),
        evaluator=read.boolean(topo, "evaluator", "topology", False),
        gpus_per_node=read.whole(topo, "gpus_per_node", "topology", 0, minimum=0),
        share_gpus=read.boolean(topo, "share_gpus", "topology", False),
        ssh_port_base=read.whole(ports, "ssh_base", "ports", SSH_PORT_BASE, minimum=1, maximum=65535),
        tensorboard_port_base=read.whole(ports, "tensorboard_base", "ports", TENSORBOARD_PORT_BASE,
                                         minimum=1, maximum=65535),
        bind=read.text(ports, "bind", "ports", LOOPBACK),
        cpus_per_node=_choice(read, topo, "cpus_per_node", machines.check_cpu_choice),
        memory_per_node=_choice(read, topo, "memory_per_node", machines.check_memory_choice),
    )
    gpus = doc.get("gpus") or []
    if not isinstance(gpus, list):
        raise read.fail("gpus", f"must be a list, not {_shown(gpus)}")
    parsed_gpus = []
    for number, raw in enumerate(gpus):
        where = f"gpus[{number}]"
        entry = read.mapping(raw, where, GPU_KEYS)
        index = read.integer(entry, "index", where, None, minimum=0)
        if index is None:
            raise read.fail(f"{where}.index", "is missing")
        parsed_gpus.append(Gpu(
            index=index,
            uuid=read.string(entry, "uuid", where, None) or "",
            name=read.string(entry, "name", where, None) or "",
            memory_mib=read.integer(entry, "memory_mib", where, 0, minimum=0) or 0,
        ))
    rate = read.string(link, "rate", "links", None)
    delay = link.get("delay_ms")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))):
        raise read.fail("links.delay_ms", f"must be a number of milliseconds, not {_shown(delay)}")
    try:
        links = Links(
            rate=link_rules.parse_rate(rate, "links.rate") if rate else None,
            delay_ms=link_rules.parse_delay(delay, "links.delay_ms") if delay is not None else None,
        )
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    place = read.mapping(swarm.get("place"), "swarm.place")
    for node, host in place.items():
        if not isinstance(host, str) or not host:
            raise read.fail(f"swarm.place.{node}", f"must name a host, not {_shown(host)}")
        try:
            check_host_label(host, f"swarm.place.{node}")
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
    for key in ("code", "data", "runs"):
        read.string(doc, key, "", None)
    packages_doc = read.mapping(doc.get("packages"), "packages", PACKAGE_KEYS)
    listed: dict[str, tuple[str, ...]] = {}
    for key, check in (("pip", check_pip), ("apt", check_apt)):
        values = packages_doc.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise read.fail(f"packages.{key}", f"must be a list of texts, not {_shown(values)}")
        try:
            listed[key] = tuple(check(v, f"packages.{key}") for v in values)
        except UserError as exc:
            raise UserError(f"{source}: {exc}") from None
    tensorflow = read.string(image, "tensorflow", "image", None)
    if tensorflow is not None:
        try:
            check_tensorflow(str(tensorflow))
        except UserError as exc:
            raise UserError(f"{source}: image.tensorflow: {exc}") from None
    try:
        check_one_line(read.string(doc, "name", "", "lab") or "lab", "name")
        check_image_ref(read.string(image, "base", "image", AUTO_BASE) or AUTO_BASE, "image.base")
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    return LabConfig(
        name=read.string(doc, "name", "", "lab") or "lab",
        target=read.string(doc, "target", "", "compose", choices=TARGETS) or "compose",
        topology=topology,
        gpus=tuple(parsed_gpus),
        host=host_from_yaml(read, doc.get("host")),
        base_image=read.string(image, "base", "image", AUTO_BASE) or AUTO_BASE,
        code=doc.get("code"),
        data=doc.get("data"),
        data_mode=read.string(doc, "data_mode", "", "copy", choices=("copy", "mount")) or "copy",
        runs=doc.get("runs") or DEFAULT_RUNS,
        shm_size=read.string(image, "shm_size", "image", "2g") or "2g",
        memlock=read.integer(image, "memlock", "image", None, minimum=-1),
        packages=Packages(pip=listed["pip"], apt=listed["apt"]),
        tensorflow=tensorflow,
        tasks=parse_tasks(doc.get("tasks"), source),
        links=links,
        swarm=SwarmSettings(place=dict(place), registry=read.string(swarm, "registry", "swarm", None)),
        warm=read.boolean(doc, "warm", "", True),
        faults=read.boolean(doc, "faults", "", False),
    )



def host_to_yaml(host: HostFacts) -> dict[str, Any]:
    """The host's facts as tflab.yaml keeps them (CPU lists as the kernel writes them)."""
    return {
        "cpus": machines.cpu_list(host.cpus),
        "numa": {str(node): machines.cpu_list(cpus) for node, cpus in sorted(host.numa_cpus.items())},
        "gpu_numa": {str(gpu): node for gpu, node in sorted(host.gpu_numa.items())},
        "memory_mib": host.memory_mib,
    }


def host_from_yaml(read: _Reader, raw: Any) -> HostFacts:
    """`host:` of tflab.yaml (absent in labs made before the split: nothing to split then)."""
    host = read.mapping(raw, "host", HOST_KEYS)

    def cpus_of(value: Any, where: str) -> tuple[int, ...]:
        if value in (None, ""):
            return ()
        try:
            return machines.parse_cpu_list(str(value))
        except ValueError:
            raise read.fail(where, f"must be a CPU list such as 0-7,16-23, not {_shown(value)}") from None

    numa, gpu_numa = {}, {}
    for key, value in read.mapping(host.get("numa"), "host.numa").items():
        if not (str(key).isascii() and str(key).isdigit()):
            raise read.fail(f"host.numa.{key}", "must be a NUMA node number")
        numa[int(key)] = cpus_of(value, f"host.numa.{key}")
    for key, value in read.mapping(host.get("gpu_numa"), "host.gpu_numa").items():
        if not (str(key).isascii() and str(key).isdigit()) or isinstance(value, bool) or not isinstance(value, int):
            raise read.fail(f"host.gpu_numa.{key}", "maps a GPU index to its NUMA node number")
        gpu_numa[int(key)] = value
    return HostFacts(cpus=cpus_of(host.get("cpus"), "host.cpus"), numa_cpus=numa, gpu_numa=gpu_numa,
                     memory_mib=read.integer(host, "memory_mib", "host", 0, minimum=0) or 0)


def _choice(read: _Reader, topo: dict, key: str, check) -> str:
    value = topo.get(key, machines.AUTO)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise read.fail(f"topology.{key}", f"must be auto, 0 or a number, not {_shown(value)}")
    try:
        return check(str(value), f"topology.{key}")
    except UserError as exc:
        raise UserError(f"{read.source}: {exc}") from None


def tasks_from_text(text: str, source: str) -> dict[str, Task]:
    """The `tasks` of a code folder's tflab.yaml text (its other keys are not a lab's)."""
    doc = load_yaml(text, source) or {}
    return parse_tasks(doc.get("tasks") if isinstance(doc, dict) else None, source)


def with_tasks(config: LabConfig, tasks: dict[str, Task]) -> LabConfig:
    """`config` with `tasks` added (existing names win)."""
    return replace(config, tasks={**tasks, **config.tasks})
