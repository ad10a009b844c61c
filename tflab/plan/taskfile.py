"""The `tasks:` of tflab.yaml (and of a code folder's own tflab.yaml): read strictly, written back short."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, GetJsonSchemaHandler, WithJsonSchema
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from tflab.plan import progress
from tflab.plan.config import BATCH, DEFAULT_SERVERS, ROLES, TASK_NAME, Task, check_task_name
from tflab.plan.strictyaml import KEY, RETIRED, Keys, NamedBy, Text, load_yaml, read_as, refused, ruled, shown


def _roles(servers: Any) -> tuple[str, ...]:
    if not isinstance(servers, list) or not all(isinstance(s, str) and s in ROLES for s in servers):
        raise refused(f"{KEY} lists roles ({', '.join(ROLES)}), not {servers!r}")
    return tuple(servers)


def _pattern(pattern: str) -> str:
    try:
        progress.check_pattern(pattern)
    except ValueError as exc:
        raise refused(f"{KEY} {exc}") from None
    return pattern


def _batch(batch: Any) -> str:
    if isinstance(batch, bool) or not (isinstance(batch, int) and batch > 0
                                       or isinstance(batch, str) and BATCH.match(batch.strip())):
        raise refused(f"{KEY} must be the examples one step takes: a whole number or {{NAME}} (a --env knob), "
                      f"optionally 'per worker'; not {shown(batch)}")
    return str(batch).strip()


class TaskKeys(Keys):
    """A task's command line, and how tflab runs it."""

    command: Text
    """The command line every node runs."""
    servers: Annotated[tuple[str, ...], BeforeValidator(_roles),
                       WithJsonSchema({"type": "array", "items": {"enum": list(ROLES)}})] = DEFAULT_SERVERS
    """The roles that only serve while it runs."""
    preload: Annotated[bool | None, RETIRED] = None
    """Retired: read and ignored (every program starts cold, as on a cluster's machine); never written."""
    progress: Annotated[Text, AfterValidator(_pattern)] | None = None
    """A regular expression of the program's progress line."""
    batch: Annotated[str, BeforeValidator(_batch),
                     WithJsonSchema({"type": ["integer", "string"]})] | None = None
    """Examples per step: N, {KNOB}, 'N per worker'."""

    @classmethod
    def checked(cls, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("command") is None:
            raise refused(f"{KEY} needs a command")
        return data


class ShortForm:
    """A task written as its command line alone (`train: python train.py`), or as a mapping (TaskKeys)."""

    @staticmethod
    def read(spec: Any) -> Any:
        if isinstance(spec, str):
            if not spec.strip():
                raise refused(f"{KEY} needs a command")
            return {"command": spec}
        if not isinstance(spec, dict):
            raise refused(f"{KEY} needs a command (a text, or a mapping with `command`), not {shown(spec)}")
        return spec

    def __get_pydantic_json_schema__(self, core: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"oneOf": [{"type": "string", "minLength": 1, "description": "the command line every node runs"},
                          handler(core)]}


def _name(name: Any) -> Any:
    """A task's name is a word (a name that is not a text is pydantic's to refuse: a key that is not a word)."""
    return ruled(lambda word, _: check_task_name(word), name) if isinstance(name, str) else name


TaskName = Annotated[str, BeforeValidator(_name)]
Tasks = Annotated[dict[TaskName, Annotated[TaskKeys, BeforeValidator(ShortForm.read), ShortForm()]],
                  NamedBy(TASK_NAME.pattern, max_length=64)]


def tasks_of(tasks: dict[str, TaskKeys]) -> dict[str, Task]:
    return {name: Task(name, spec.command, spec.servers, spec.progress, spec.batch)
            for name, spec in tasks.items()}


class TaskFile(Keys):
    """The tasks of a file (a lab's tflab.yaml, or a code folder's own)."""

    tasks: Tasks | None = {}


def parse_tasks(raw: Any, source: str) -> dict[str, Task]:
    """Tasks as tflab.yaml writes them: `name: command` or `name: {command:, servers:, progress:, batch:}`."""
    return tasks_of(read_as(TaskFile, {"tasks": raw}, source).tasks or {})


def dump_tasks(tasks: dict[str, Task]) -> dict[str, Any]:
    """Tasks back into their tflab.yaml form (the short form when it says everything)."""
    out: dict[str, Any] = {}
    for name, task in tasks.items():
        if task.servers == DEFAULT_SERVERS and task.progress is None and task.batch is None:
            out[name] = task.command
        else:
            spec: dict[str, Any] = {"command": task.command}
            if task.servers != DEFAULT_SERVERS:
                spec["servers"] = list(task.servers)
            if task.progress is not None:
                spec["progress"] = task.progress
            if task.batch is not None:
                spec["batch"] = int(task.batch) if task.batch.isdigit() else task.batch
            out[name] = spec
    return out


def tasks_from_text(text: str, source: str) -> dict[str, Task]:
    """The `tasks` of a code folder's tflab.yaml text (its other keys are not a lab's)."""
    doc = load_yaml(text, source) or {}
    return parse_tasks(doc.get("tasks") if isinstance(doc, dict) else None, source)
