"""The `tasks:` of tflab.yaml (and of a code folder's own tflab.yaml): read strictly, written back short."""

from __future__ import annotations

from typing import Any

from tflab.plan import progress
from tflab.plan.config import BATCH, DEFAULT_SERVERS, ROLES, Task, check_task_name
from tflab.plan.strictyaml import Reader, load_yaml, shown

TASK_KEYS = ("command", "servers", "preload", "progress", "batch")
# A task as JSON Schema says it (tflab.yaml's schema, labfile.json_schema): a command line, or a mapping of TASK_KEYS.
TASK_SCHEMA: dict[str, Any] = {"oneOf": [
    {"type": "string", "minLength": 1, "description": "the command line every node runs"},
    {"type": "object", "required": ["command"], "additionalProperties": False, "properties": {
        "command": {"type": "string", "minLength": 1},
        "servers": {"type": "array", "items": {"enum": list(ROLES)}, "description": "the roles that only serve"},
        "preload": {"type": "boolean", "default": True},
        "progress": {"type": "string", "description": "a regular expression of the program's progress line"},
        "batch": {"type": ["integer", "string"], "description": "examples per step: N, {KNOB}, 'N per worker'"}}},
]}


def parse_tasks(raw: Any, source: str) -> dict[str, Task]:
    """Tasks as tflab.yaml writes them: `name: command` or `name: {command:, servers:, preload:}`."""
    read = Reader(source)
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
            raise read.fail(where, f"needs a command (a text, or a mapping with `command`), not {shown(spec)}")
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
                                                  f"(a --env knob), optionally 'per worker'; not {shown(batch)}")
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






def tasks_from_text(text: str, source: str) -> dict[str, Task]:
    """The `tasks` of a code folder's tflab.yaml text (its other keys are not a lab's)."""
    doc = load_yaml(text, source) or {}
    return parse_tasks(doc.get("tasks") if isinstance(doc, dict) else None, source)
