"""How each kind of tflab.yaml value is read, strictly, and what it may hold as JSON Schema says it.

A reader (`Reads`) takes the mapping a key is in and returns the key's value, or raises a
UserError that names the file and the key; its schema is what an editor checks the same key with.
The kinds are tflab's own: a whole number with bounds, a text with choices or a check, a node's
CPU or memory share, a link's rate and delay, package lists, a TensorFlow pin and a Keras
choice, a swarm's placement, the host's GPUs and CPU facts, the tasks. Which key of the file has
which kind, and in what order the file writes them, is plan/labfile.py's table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tflab.errors import UserError
from tflab.plan import links as link_rules
from tflab.plan import shares, taskfile
from tflab.plan.config import (
    KERAS_CHOICES,
    TASK_NAME,
    LabConfig,
    check_host_label,
    check_keras,
    check_tensorflow,
)
from tflab.plan.config import Task
from tflab.plan.gpus import Gpu
from tflab.plan.shares import HostFacts
from tflab.plan.strictyaml import Reader, shown

ReadKey = Callable[[Reader, dict, str, str], Any]  # (reader, the mapping, the key, where the mapping is) -> value
Json = dict[str, Any]


@dataclass(frozen=True)
class Reads:
    """How a key is read (strictly), and what it may hold as JSON Schema says it: from the same declaration come
    the reader's one-line errors and the schema an editor checks the file with as the user types (`tflab schema`)."""

    read: ReadKey
    schema: Json

    def __call__(self, read: Reader, doc: dict, key: str, where: str) -> Any:
        return self.read(read, doc, key, where)


def _nullable(kind: str | list[str]) -> list[str]:
    """A key left empty (null) reads as its default."""
    return [*([kind] if isinstance(kind, str) else kind), "null"]


# -- how values are read ---------------------------------------------------------------------------


@contextmanager
def said_as_the_files(read: Reader, prefix: str = "") -> Iterator[None]:
    """A check's UserError, said as the file's: `tflab.yaml: ...` (after `prefix`, where the check names no key)."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{read.source}: {prefix}{exc}") from None


def _bounds(minimum: int | None, maximum: int | None = None) -> Json:
    return {**({"minimum": minimum} if minimum is not None else {}), **({"maximum": maximum} if maximum is not None else {})}


def whole(default: int, minimum: int | None = None, maximum: int | None = None) -> ReadKey:
    return Reads(lambda read, doc, key, where: read.whole(doc, key, where, default, minimum, maximum),
                 {"type": "integer", "default": default, **_bounds(minimum, maximum)})


def integer(default: int | None, minimum: int | None = None) -> ReadKey:
    return Reads(lambda read, doc, key, where: read.integer(doc, key, where, default, minimum),
                 {"type": _nullable("integer"), **({"default": default} if default is not None else {}),
                  **_bounds(minimum)})


def boolean(default: bool) -> ReadKey:
    return Reads(lambda read, doc, key, where: read.boolean(doc, key, where, default),
                 {"type": "boolean", "default": default})


def text(default: str) -> ReadKey:
    return Reads(lambda read, doc, key, where: read.text(doc, key, where, default),
                 {"type": "string", "minLength": 1, "default": default})


def string(default: str | None, choices: tuple[str, ...] | None = None,
           check: Callable[[str, str], object] | None = None) -> ReadKey:
    """A text (or `default`); `check(value, name)` raises a UserError for a value it refuses."""
    def read_it(read: Reader, doc: dict, key: str, where: str) -> str | None:
        value = read.string(doc, key, where, default, choices=choices)
        if value is not None and check is not None:
            with said_as_the_files(read):
                check(value, f"{where}.{key}" if where else key)
        return value if value is not None else default
    schema: Json = {"type": _nullable("string"), "minLength": 1}
    if choices is not None:
        schema["enum"] = [*choices, None]
    return Reads(read_it, {**schema, **({"default": default} if default is not None else {})})


def path(default: str | None) -> ReadKey:
    """A folder of the lab (code, data, runs): a text, as written."""
    def read_it(read: Reader, doc: dict, key: str, where: str) -> str | None:
        read.string(doc, key, where, None)
        return doc.get(key) or default
    return Reads(read_it, {"type": _nullable("string"), "minLength": 1,
                           **({"default": default} if default is not None else {})})


def share(check: Callable[[str, str], str]) -> ReadKey:
    """A node's CPUs or memory: auto, 0 or an amount."""
    def read_it(read: Reader, doc: dict, key: str, where: str) -> str:
        value = doc.get(key, shares.AUTO)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise read.fail(f"{where}.{key}", f"must be auto, 0 or a number, not {shown(value)}")
        with said_as_the_files(read):
            return check(str(value), f"{where}.{key}")
    return Reads(read_it, {"type": ["string", "number"], "default": shares.AUTO,
                           "description": "auto, 0 (no limit) or an amount"})


def _link_rate(read: Reader, doc: dict, key: str, where: str) -> str | None:
    rate = read.string(doc, key, where, None)
    with said_as_the_files(read):
        return link_rules.parse_rate(rate, f"{where}.{key}") if rate else None


link_rate = Reads(_link_rate, {"type": _nullable("string"), "description": "a rate, such as 1gbit or 100mbit"})


def _link_delay(read: Reader, doc: dict, key: str, where: str) -> float | None:
    delay = doc.get(key)
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise read.fail(f"{where}.{key}", f"must be a number of milliseconds, not {shown(delay)}")
    with said_as_the_files(read):
        return link_rules.parse_delay(delay, f"{where}.{key}")


link_delay = Reads(_link_delay, {"type": _nullable("number"), "minimum": 0, "description": "milliseconds each way"})


def package_list(check: Callable[[str, str], str]) -> ReadKey:
    def read_it(read: Reader, doc: dict, key: str, where: str) -> tuple[str, ...]:
        values = doc.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise read.fail(f"{where}.{key}", f"must be a list of texts, not {shown(values)}")
        with said_as_the_files(read):
            return tuple(check(v, f"{where}.{key}") for v in values)
    return Reads(read_it, {"type": _nullable("array"), "items": {"type": "string"}})


def _tensorflow(read: Reader, doc: dict, key: str, where: str) -> str | None:
    value = read.string(doc, key, where, None)
    if value is not None:
        with said_as_the_files(read, f"{where}.{key}: "):
            check_tensorflow(str(value))
    return value


tensorflow = Reads(_tensorflow, {"type": _nullable("string"), "description": "a TensorFlow version, such as '2.15.0'"})


def _keras(read: Reader, doc: dict, key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    with said_as_the_files(read):
        return check_keras(value, f"{where}.{key}")


keras = Reads(_keras, {"enum": [*KERAS_CHOICES, *map(str, KERAS_CHOICES), None],
                       "description": "2: Keras 2 (tf-keras) on today's TensorFlow; empty: its own Keras"})


def _placement(read: Reader, doc: dict, key: str, where: str) -> dict[str, str]:
    place = read.mapping(doc.get(key), f"{where}.{key}")
    for node, host in place.items():
        if not isinstance(host, str) or not host:
            raise read.fail(f"{where}.{key}.{node}", f"must name a host, not {shown(host)}")
        with said_as_the_files(read):
            check_host_label(host, f"{where}.{key}.{node}")
    return dict(place)


placement = Reads(_placement, {"type": _nullable("object"), "additionalProperties": {"type": "string", "minLength": 1}})


def _gpus(read: Reader, doc: dict, key: str, where: str) -> tuple[Gpu, ...]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise read.fail(key, f"must be a list, not {shown(entries)}")
    found = []
    for number, raw in enumerate(entries):
        at = f"{key}[{number}]"
        entry = read.mapping(raw, at, ("index", "uuid", "name", "memory_mib"))
        index = read.integer(entry, "index", at, None, minimum=0)
        if index is None:
            raise read.fail(f"{at}.index", "is missing")
        found.append(Gpu(index=index, uuid=read.string(entry, "uuid", at, None) or "",
                         name=read.string(entry, "name", at, None) or "",
                         memory_mib=read.integer(entry, "memory_mib", at, 0, minimum=0) or 0))
    return tuple(found)


gpus = Reads(_gpus, {"type": _nullable("array"), "items": {
    "type": "object", "required": ["index"], "additionalProperties": False,
    "properties": {"index": {"type": "integer", "minimum": 0}, "uuid": {"type": _nullable("string")},
                   "name": {"type": _nullable("string")}, "memory_mib": {"type": _nullable("integer"), "minimum": 0}}}})


def write_gpus(config: LabConfig) -> list[dict[str, Any]]:
    return [{k: v for k, v in (("index", g.index), ("name", g.name), ("memory_mib", g.memory_mib)) if v or k == "index"}
            for g in config.gpus]


def _host(read: Reader, doc: dict, key: str, where: str) -> HostFacts:
    """`host:` (absent in labs made before the split: nothing to split then)."""
    facts = read.mapping(doc.get(key), key, ("cpus", "numa", "gpu_numa", "memory_mib"))

    def cpus_of(value: Any, at: str) -> tuple[int, ...]:
        if value in (None, ""):
            return ()
        try:
            return shares.parse_cpu_list(str(value))
        except ValueError:
            raise read.fail(at, f"must be a CPU list such as 0-7,16-23, not {shown(value)}") from None

    numa, gpu_numa = {}, {}
    for node, value in read.mapping(facts.get("numa"), "host.numa").items():
        if not (str(node).isascii() and str(node).isdigit()):
            raise read.fail(f"host.numa.{node}", "must be a NUMA node number")
        numa[int(node)] = cpus_of(value, f"host.numa.{node}")
    for gpu, value in read.mapping(facts.get("gpu_numa"), "host.gpu_numa").items():
        if not (str(gpu).isascii() and str(gpu).isdigit()) or isinstance(value, bool) or not isinstance(value, int):
            raise read.fail(f"host.gpu_numa.{gpu}", "maps a GPU index to its NUMA node number")
        gpu_numa[int(gpu)] = value
    return HostFacts(cpus=cpus_of(facts.get("cpus"), "host.cpus"), numa_cpus=numa, gpu_numa=gpu_numa,
                     memory_mib=read.integer(facts, "memory_mib", "host", 0, minimum=0) or 0)


_CPU_LIST: Json = {"type": _nullable(["string", "integer"]), "description": "a CPU list, such as 0-7,16-23"}
host = Reads(_host, {"type": _nullable("object"), "additionalProperties": False, "properties": {
    "cpus": _CPU_LIST,
    "numa": {"type": _nullable("object"), "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": _CPU_LIST},
    "gpu_numa": {"type": _nullable("object"), "propertyNames": {"pattern": "^[0-9]+$"},
                 "additionalProperties": {"type": "integer"}},
    "memory_mib": {"type": _nullable("integer"), "minimum": 0}}})


def write_host(config: LabConfig) -> dict[str, Any]:
    """The host's facts as tflab.yaml keeps them (CPU lists as the kernel writes them)."""
    facts = config.host
    return {"cpus": shares.cpu_list(facts.cpus),
            "numa": {str(node): shares.cpu_list(cpus) for node, cpus in sorted(facts.numa_cpus.items())},
            "gpu_numa": {str(gpu): node for gpu, node in sorted(facts.gpu_numa.items())},
            "memory_mib": facts.memory_mib}


def _tasks(read: Reader, doc: dict, key: str, where: str) -> dict[str, Task]:
    return taskfile.parse_tasks(doc.get(key), read.source)


tasks = Reads(_tasks, {"type": _nullable("object"), "additionalProperties": taskfile.TASK_SCHEMA,
                       "propertyNames": {"pattern": TASK_NAME.pattern, "maxLength": 64}})
