"""`runs/TASK/run.json`: what a run is doing or did, kept beside its logs (and read by `runs`)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflab import steps
from tflab.runstate import RunMachine

RUN_FILE = "run.json"
OUTPUT_FILE = "output.log"
LOG_DIR = "logs"


def stamp(epoch: float) -> str:
    """A wall-clock time as people read it in a table (local time, seconds)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` still exists on this host."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def node_rows(machine: RunMachine) -> dict[str, dict[str, Any]]:
    """Each node's part in the run, as run.json keeps it."""
    rows = {}
    for name, node in machine.nodes.items():
        rate = steps.rate(node.steps)
        rows[name] = {
            "role": node.role,
            "attempt": node.attempt,
            "exit_code": node.exit_code,
            "verdict": node.verdict,
            "reason": node.reason,
            "duration_s": None if node.duration is None else round(node.duration, 2),
            "steps_per_s": None if rate is None else round(rate, 2),
        }
    return rows


@dataclass
class RunRecord:
    """The run.json of one run, rewritten as the run goes (atomically: readers never see half)."""

    folder: Path
    task: str
    detached: bool
    started: float  # wall clock

    def write(self, state: str, machine: RunMachine, result: str | None = None,
              first_step_s: float | None = None) -> dict[str, Any]:
        finish = machine.finish if state == "finished" else None
        chief = machine.nodes.get(machine.plan.chief)
        rate = steps.rate(chief.steps) if chief is not None else None
        now = time.time()
        data = {
            "task": self.task,
            "state": state,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "detached": self.detached,
            "started": self.started,
            "ended": now if finish else None,
            "duration_s": round(now - self.started, 2),
            "verdict": finish.verdict if finish else None,
            "exit_code": finish.exit_code if finish else None,
            "problem": finish.problem if finish else None,
            "result": result,
            "steps_per_s": None if rate is None else round(rate, 2),
            "first_step_s": None if first_step_s is None else round(first_step_s, 2),
            "nodes": node_rows(machine),
        }
        save(self.folder, data)
        return data


def save(folder: Path, data: dict[str, Any]) -> None:
    """Write `folder`/run.json whole."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{RUN_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, folder / RUN_FILE)


def load(folder: Path) -> dict[str, Any] | None:
    """The run.json in `folder`, or None when there is none (or it cannot be read)."""
    try:
        data = json.loads((folder / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_live(data: dict[str, Any]) -> bool:
    """Whether a run that is not finished still has its supervisor (on this host)."""
    return data.get("state") != "finished" and data.get("host") == socket.gethostname() and pid_alive(data.get("pid"))


def all_runs(runs_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every run kept under the runs folder (the current one of a task and the ones moved aside)."""
    found = []
    if runs_dir.is_dir():
        for folder in runs_dir.iterdir():
            data = load(folder) if folder.is_dir() else None
            if data is not None:
                found.append((folder, data))
    return sorted(found, key=lambda item: item[1].get("started") or 0)
