"""`runs/TASK/run.json` as one typed record (RunReport): what a run is doing or did, written and read only here.

The run's supervisor rewrites it as the run goes (whole, atomically: readers never see half);
`tflab runs`, `attach`, `stop`, `top` and a sweep read it back. A file edited by hand, or
half-written by another tool, is read as no record rather than trusted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflab.host.proc import pid_alive

RUN_FILE = "run.json"
NUMBER = (int, float)


@dataclass(frozen=True)
class NodeRow:
    """One node's part in a run."""

    role: str
    attempt: int = 0
    exit_code: int | None = None
    verdict: str = "pending"
    reason: str | None = None  # DESIGN: oom, stopped (tflab stopped it), outside (a signal tflab did not send), or null
    signal: str | None = None  # the signal that ended its process, by name
    said: str | None = None  # how it ended in words: "killed by SIGKILL from outside tflab", "its container stopped"
    duration_s: float | None = None
    steps_per_s: float | None = None  # its own steps' rate, where it says its own steps
    recent_steps_per_s: float | None = None  # over the last seconds, while it runs
    global_steps_per_s: float | None = None  # the cluster's (its global step's) rate as it saw it, where it says it
    diagnosis: dict[str, str] | None = None  # a known failure its output shows: id, cause, cure (run/failures)
    waits: str | None = None  # where its stacks showed it waiting, in a sentence (run/waits), when tflab asked
    stack: str | None = None  # those stacks whole: py-spy's dump of every thread of its processes


@dataclass(frozen=True)
class RunReport:
    """What one run is doing (state starting, running, stopping) or did (finished, with its verdict)."""

    task: str
    state: str
    pid: int | None = None  # the supervisor's (tflab's) process, on `host`
    pid_start: str | None = None  # when that process started (a recycled pid is not it)
    host: str | None = None
    detached: bool = False
    started: float | None = None  # wall clock
    ended: float | None = None
    duration_s: float | None = None
    verdict: str | None = None  # once finished: ok | failed | hung | oom | timeout | interrupted
    exit_code: int | None = None
    problem: str | None = None
    result: str | None = None  # the chief's last line of its own
    steps_per_s: float | None = None  # the cluster's: the global step's rate where the program shows one, else the chief's
    steps_are_global: bool | None = None  # whether steps_per_s is the global step's rate
    steady_steps_per_s: float | None = None  # after the first 20% of the steps: what a sweep compares
    first_step_s: float | None = None
    note: str | None = None
    limit: dict[str, str] | None = None  # what limited the run (run/bottleneck.Limit), once it finished
    knobs: dict[str, Any] | None = None  # what the run changed of the lab's design (plan/knobs)
    cluster: dict[str, dict[str, Any]] | None = None  # each node's mean CPU (of its share) and Mbit/s
    quality: dict[str, float] | None = None  # the chief's metrics as it last printed them (accuracy, loss, ...)
    quality_series: dict[str, list[Any]] | None = None  # each metric's [seconds since the start, value] pairs
    faults: list[dict[str, Any]] = field(default_factory=list)  # the drill's faults, as they went
    stall: dict[str, Any] | None = None  # a stalled run's look at its cluster: who reaches whom (run/stalls)
    nodes: dict[str, NodeRow] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def is_live(self) -> bool:
        """Whether a run that is not finished still has its supervisor (on this host)."""
        return not self.finished and self.host == socket.gethostname() and pid_alive(self.pid, self.pid_start)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, folder: Path) -> None:
        """Write `folder`/run.json whole."""
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{RUN_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, folder / RUN_FILE)

    @classmethod
    def from_json(cls, data: Any) -> RunReport | None:
        """The record `data` holds, or None where a key holds what tflab never writes there."""
        if not isinstance(data, dict) or not holds_types(data, _TYPES) or not isinstance(data.get("task"), str) \
                or not isinstance(data.get("state"), str):
            return None
        nodes = data.get("nodes") or {}
        if not all(isinstance(row, dict) and isinstance(row.get("role"), str) and holds_types(row, _NODE_TYPES)
                   for row in nodes.values()) or not all(isinstance(row, dict) for row in data.get("faults") or []):
            return None
        known = {k: v for k, v in data.items() if k in _TYPES and v is not None}
        known["nodes"] = {str(name): NodeRow(**{k: v for k, v in row.items() if k in _NODE_TYPES})
                          for name, row in nodes.items()}
        return cls(**known)


def load(folder: Path) -> RunReport | None:
    """The run.json in `folder`, or None when there is none (or it cannot be read, or is not one tflab wrote)."""
    try:
        data = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return RunReport.from_json(data)


def _types_of(kind: type) -> dict[str, type | tuple[type, ...]]:
    """What each field of a record holds in JSON, from its annotation."""
    json_types: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": NUMBER, "bool": bool,
                                                       "dict": dict, "list": list}
    found = {}
    for each in dataclasses.fields(kind):
        annotation = str(each.type).split("[", 1)[0].split(" | ", 1)[0]
        found[each.name] = json_types[annotation]
    return found


def holds_types(data: dict[str, Any], types: dict[str, type | tuple[type, ...]]) -> bool:
    """Whether each key of `data` that `types` names holds that type (or None); no bool for a number, no NaN."""
    for key, kind in types.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            return False
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return False
    return True


_TYPES = _types_of(RunReport)
_NODE_TYPES = _types_of(NodeRow)
