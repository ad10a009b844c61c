"""A task's outputs on the host: its run folder (fresh or moved aside), the runs kept, the execs' records, who runs what.

run.json itself, the record of one run, is run/runreport.py's.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tflab_guard import protocol

from tflab.errors import UserError
from tflab.host.proc import pid_alive, process_start
from tflab.plan import progress, quality
from tflab.run.machine import RunMachine
from tflab.run.noderun import NodeRun
from tflab.run.runreport import NUMBER, RUN_FILE, NodeRow, RunReport, holds_types, load
from tflab.run.words import Verdict

OUTPUT_FILE = "output.log"
LOG_DIR = "logs"
RECENT_S = 10.0  # the window of a running node's current steps/s


def stamp(epoch: float) -> str:
    """A wall-clock time as people read it in a table (local time, seconds)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))




def node_rows(machine: RunMachine, diagnoses: dict[str, dict[str, str]] | None = None) -> dict[str, NodeRow]:
    """Each node's part in the run, as run.json keeps it (with the known failure its output shows, where one does)."""
    rows = {}
    for name, node in machine.nodes.items():
        rate = node.rate()
        recent = node.rate(RECENT_S) if node.running else None
        seen = node.global_rate()
        rows[name] = NodeRow(
            role=node.role, attempt=node.attempt, exit_code=node.exit_code, verdict=node.verdict,
            reason=protocol.RECORD_REASONS.get(node.ended_by or ""), signal=node.signal, said=node.reason,
            duration_s=None if node.duration is None else round(node.duration, 2),
            steps_per_s=None if rate is None else round(rate, 2),
            recent_steps_per_s=None if recent is None else round(recent, 2),
            global_steps_per_s=None if seen is None else round(seen, 2),
            diagnosis=(diagnoses or {}).get(name),
            waits=None if node.wait is None or not node.wait.known else node.wait.sentence(name), stack=node.stack,
        )
    return rows


def global_counter(machine: RunMachine) -> NodeRun | None:
    """The finisher whose printed global step best says the cluster's rate: the chief where it says it, else the one
    that said it most; None where no finisher shows a global step."""
    order = [machine.plan.chief, *machine.plan.finishers]
    shown = [machine.nodes[n] for n in order if n in machine.nodes and machine.nodes[n].global_rate() is not None]
    if not shown:
        return None
    chief = machine.nodes.get(machine.plan.chief)
    return chief if chief in shown else max(shown, key=lambda node: len(node.global_steps) + len(node.global_rates))


def quality_of(machine: RunMachine) -> dict[str, Any]:
    """run.json's `quality` (each metric's last value) and `quality_series` (its [t, value] pairs since the start),
    from the chief, or the first finisher that printed any."""
    order = [machine.plan.chief, *machine.plan.finishers]
    node = next((machine.nodes[n] for n in order if n in machine.nodes and machine.nodes[n].quality), None)
    if node is None:
        return {"quality": None, "quality_series": None}
    began = machine.began or 0.0
    last: dict[str, float] = {}
    series: dict[str, list[list[float]]] = {}
    for t, metric, value in node.quality:
        last[metric] = value
        series[metric] = quality.thin(series.get(metric, []) + [[round(t - began, 2), value]])
    return {"quality": last, "quality_series": series}


@dataclass
class RunRecorder:
    """Writes one run's run.json as the run goes."""

    folder: Path
    task: str
    detached: bool
    started: float  # wall clock
    knobs: dict[str, Any] | None = None  # what the run changed of the lab's design (plan.knobs)

    def write(self, state: str, machine: RunMachine, result: str | None = None,
              first_step_s: float | None = None, note: str | None = None,
              limit: dict[str, str] | None = None,
              cluster: dict[str, dict[str, float | None]] | None = None,
              diagnoses: dict[str, dict[str, str]] | None = None, stall: dict[str, Any] | None = None) -> RunReport:
        finish = machine.finish if state == "finished" else None
        chief = machine.nodes.get(machine.plan.chief)
        counter = global_counter(machine)
        if counter is not None:  # the cluster's rate: its global step
            rate, steady = counter.global_rate(), progress.steady_rate(counter.global_steps) if finish else None
        else:
            rate = chief.rate() if chief is not None else None
            steady = progress.steady_rate(chief.steps) if chief is not None and finish else None
        now = time.time()
        report = RunReport(
            task=self.task, state=state, pid=os.getpid(), pid_start=process_start(os.getpid()),
            host=socket.gethostname(), detached=self.detached, started=self.started,
            ended=now if finish else None, duration_s=round(now - self.started, 2),
            verdict=finish.verdict if finish else None, exit_code=finish.exit_code if finish else None,
            problem=finish.problem if finish else None, result=result,
            steps_per_s=None if rate is None else round(rate, 2),
            steps_are_global=None if rate is None else counter is not None,
            steady_steps_per_s=None if steady is None else round(steady, 3),
            first_step_s=None if first_step_s is None else round(first_step_s, 2),
            note=note, limit=limit, knobs=self.knobs, cluster=cluster,
            **quality_of(machine),
            faults=machine.drills.rows(machine.began), stall=stall, nodes=node_rows(machine, diagnoses),
        )
        report.save(self.folder)
        return report


# What each key of an exec's record holds, as ExecSession writes it: a file edited by hand, or
# half-written by another tool, is read as no record rather than trusted.
RECORD_TYPES: dict[str, type | tuple[type, ...]] = {
    "task": str, "state": str, "pid": int, "pid_start": str, "host": str, "node": str, "id": str,
    "started": NUMBER, "ended": NUMBER, "verdict": str, "exit_code": int, "steps_per_s": NUMBER,
}


def well_formed(data: Any) -> bool:
    """Whether an exec's record holds what tflab writes there (None for any key)."""
    return isinstance(data, dict) and holds_types(data, RECORD_TYPES)


def a_runs_folder(folder: Path) -> bool:
    """Whether a folder is a run's: tflab's own files in it, or what a task writes to /runs/TASK (checkpoints, events)."""
    if (folder / RUN_FILE).is_file() or (folder / LOG_DIR).is_dir() or (folder / "checkpoint").is_file():
        return True
    return any(folder.glob("*.index")) or any(folder.glob("events.out.tfevents.*"))


def fresh_run_dir(runs_dir: Path, task: str, resume: bool) -> Path:
    """The host side of /runs/TASK: a previous run's is moved aside (to TASK.<time>) unless resuming."""
    folder = runs_dir / task
    if folder.exists() and not resume:
        if not a_runs_folder(folder):  # never move what tflab did not make
            raise UserError(f"{folder} is not a run tflab made (no {RUN_FILE}, {LOG_DIR}/ or checkpoint in it), and "
                            f"a run of {task} would move it aside: rename it, or point the lab's runs elsewhere")
        earlier = load(folder)  # named by when it started, as `tflab runs` lists it (its folder's mtime: when it ended)
        began = earlier.started if earlier is not None and earlier.started else folder.stat().st_mtime
        stamp_ = time.strftime("%Y%m%d-%H%M%S", time.localtime(began))
        aside = runs_dir / f"{task}.{stamp_}"
        number = 1
        while aside.exists():
            number += 1
            aside = runs_dir / f"{task}.{stamp_}-{number}"
        folder.rename(aside)
    (folder / LOG_DIR).mkdir(parents=True, exist_ok=True)
    return folder


def unreadable(runs_dir: Path) -> list[Path]:
    """The folders under the runs folder whose run.json tflab cannot read as a run's."""
    if not runs_dir.is_dir():
        return []
    return sorted(f for f in runs_dir.iterdir() if (f / RUN_FILE).is_file() and load(f) is None)


def all_runs(runs_dir: Path) -> list[tuple[Path, RunReport]]:
    """Every run kept under the runs folder (the current one of a task and the ones moved aside)."""
    found = []
    if runs_dir.is_dir():
        for folder in runs_dir.iterdir():
            report = load(folder) if folder.is_dir() else None
            if report is not None:
                found.append((folder, report))
    return sorted(found, key=lambda item: item[1].started or 0)


class ExecRecords:
    """The execs of one task: a small JSON file each, written whole."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, node: str, ident: str) -> Path:
        return self.folder / f"{node}-{ident}.json"

    def write(self, node: str, data: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(node, data["id"])
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, target)

    def all(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError, RecursionError):
                continue
            if well_formed(data):
                found.append(data)
        return found

    def live(self, exclude: str | None = None) -> list[dict[str, Any]]:
        """Records of execs still going: not ended, their tflab process alive."""
        return [r for r in self.all() if r.get("ended") is None and r.get("id") != exclude
                and pid_alive(r.get("pid"), r.get("pid_start"))]


def holding(runs_dir: Path, execs_dir: Path, task: str) -> str | None:
    """What of another task holds the lab's nodes now (a live run, foreground or detached, or an exec), in words;
    None where nothing does. One task at a time per node: a second one would meet the first's servers on its ports."""
    for _folder, report in all_runs(runs_dir):
        if report.task != task and not report.finished and report.is_live():
            how = "detached" if report.detached else f"pid {report.pid}"
            return (f"run {report.task} holds the lab's nodes ({how}): one task at a time per node; `tflab stop "
                    f"{report.task}` ends it (`tflab attach {report.task}` follows it)")
    if execs_dir.is_dir():
        for folder in sorted(execs_dir.iterdir()):
            if folder.name == task:
                continue
            for record in ExecRecords(folder).live():
                return (f"`tflab exec {record.get('node')} {folder.name}` holds the lab's nodes (pid {record.get('pid')}, "
                        "in another terminal): one task at a time per node; end it there (Ctrl-C) first")
    return None


def all_execs(execs_dir: Path) -> list[dict[str, Any]]:
    """Every exec of every task kept here (going, ended or abandoned), oldest first, each with its `state`."""
    found = []
    if execs_dir.is_dir():
        for folder in sorted(p for p in execs_dir.iterdir() if p.is_dir()):
            for record in ExecRecords(folder).all():
                if record.get("ended") is not None:
                    state = str(record.get("verdict") or "ended")
                elif pid_alive(record.get("pid"), record.get("pid_start")):
                    state = Verdict.RUNNING
                else:
                    state = Verdict.ABANDONED
                found.append({**record, "task": record.get("task") or folder.name, "state": state})
    return sorted(found, key=lambda r: r.get("started") or 0)


def activity(runs_dir: Path, execs_dir: Path) -> dict[str, tuple[str, float | None]]:
    """What each node is running now, by node: (task, its current steps/s), from live runs and execs."""
    found: dict[str, tuple[str, float | None]] = {}
    for _folder, report in all_runs(runs_dir):
        if not report.is_live():
            continue
        for node, row in report.nodes.items():
            if row.verdict in (Verdict.RUNNING, Verdict.HELD):
                found[node] = (report.task, row.recent_steps_per_s)
    if execs_dir.is_dir():
        for folder in sorted(execs_dir.iterdir()):
            for record in ExecRecords(folder).live():
                found[record["node"]] = (record.get("task", folder.name), record.get("steps_per_s"))
    return found
