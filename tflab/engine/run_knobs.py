"""A run's knobs on the nodes themselves: links and CPU quotas set for one run, and put back after it.

What a run changed is noted in the lab's state folder before it changes anything (its pid
beside it), so however the run ends the lab gets its own design back: the run puts it back
itself (verdict, Ctrl-C, `tflab stop`), and when tflab was killed the next tflab command that
opens the lab's engine side finds the note of a process that is gone and restores it.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tflab.engine.faults import SHAPE_SH, FaultInjector
from tflab.errors import EngineError, UserError
from tflab.host.fanout import parallel
from tflab.host.proc import pid_alive, process_start
from tflab.plan.knobs import UNSHAPED, Knobs, check_design

KNOBS_FILE = "run-knobs.json"


class KnobSetter:
    """Sets one run's link rate and CPU shares on its nodes, and restores the lab's own."""

    def __init__(self, injector: FaultInjector) -> None:
        self.injector = injector
        self.lf = injector.lf

    def check(self, knobs: Knobs, task: str) -> None:
        """A one-line error where the lab cannot take these knobs now (nothing is changed)."""
        check_lab(self.lf, knobs)
        note = read_note(self.lf)
        if knobs.changes_engine and note is not None and pid_alive(note.get("pid"), note.get("pid_start")):
            raise UserError(f"run {note.get('task')} (pid {note.get('pid')}) has changed this lab's "
                            f"{_what(note)} for itself; wait until it ends before a run that changes them")
        for node in knobs.cpus:
            self.injector.container(node)

    def apply(self, knobs: Knobs, task: str, nodes: list[str]) -> None:
        """Give `nodes` the knobs' link rate and CPU shares (noted first, so a killed tflab's are restored)."""
        if not knobs.changes_engine:
            return
        link_nodes = nodes if knobs.link_rate is not None else []
        write_note(self.lf, {"task": task, "pid": os.getpid(), "pid_start": process_start(os.getpid()),
                             "link": link_nodes, "cpus": sorted(knobs.cpus)})

        def set_node(node: str) -> None:
            if node in link_nodes:
                self._shape(node, knobs.link_rate or UNSHAPED)
            share = knobs.cpus.get(node)
            if share is not None:
                self.injector.set_cpu(node, share)

        parallel(set_node, sorted(set(link_nodes) | set(knobs.cpus)), name="knobs")

    def _shape(self, node: str, rate: str) -> None:
        if rate == UNSHAPED:
            code, out = self.injector.executor_for([node]).run(
                node, ["env", "TFLAB_LINK_RATE=", "TFLAB_LINK_DELAY_MS=", SHAPE_SH])
            if code != 0:
                raise EngineError(f"unshaping {node}'s link failed: {out.strip() or code}")
        else:
            self.injector.slow(node, rate)

    def restore(self) -> list[str]:
        """Put the lab's own links and CPU quotas back where a run's note says it changed them."""
        note = read_note(self.lf)
        if note is None:
            return []
        present = set(self.injector.present())
        done: list[str] = []

        def restore_node(node: str) -> list[str]:
            said = []
            if node in note.get("link", []):
                self.injector.unslow(node)
                said.append(f"{node}'s link back to {self.lf.config.links.describe()}")
            if node in note.get("cpus", []):
                self.injector.restore_cpu(node)
                said.append(f"{node}'s CPU back to its own")
            return said

        nodes = sorted((set(note.get("link", [])) | set(note.get("cpus", []))) & present)
        for said in parallel(restore_node, nodes, name="restore"):
            done += said
        clear_note(self.lf)
        return done


def check_lab(lf: Any, knobs: Knobs) -> None:
    """A one-line error where the lab's design cannot take these knobs (asked before the engine is)."""
    check_design(knobs, lf.config.net_admin)


def _what(note: dict[str, Any]) -> str:
    parts = (["links"] if note.get("link") else []) + (["CPU quotas"] if note.get("cpus") else [])
    return " and ".join(parts) or "nodes"


def read_note(lf: Any) -> dict[str, Any] | None:
    """What a run changed on the nodes and has not put back yet (None: nothing)."""
    path = lf.state_dir / KNOBS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"task": "?", "link": [], "cpus": []}
    if not isinstance(data, dict):
        return {"task": "?", "link": [], "cpus": []}
    for key in ("link", "cpus"):  # node names; anything else (a hand-edited string, a number) names none
        value = data.get(key)
        data[key] = [n for n in value if isinstance(n, str)] if isinstance(value, list) else []
    return data


def write_note(lf: Any, data: dict[str, Any]) -> None:
    path = lf.state_file(KNOBS_FILE)
    tmp = path.with_name(f".{KNOBS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def clear_note(lf: Any) -> None:
    try:
        (lf.state_dir / KNOBS_FILE).unlink()
    except FileNotFoundError:
        pass


def left_behind(lf: Any) -> bool:
    """Whether a run that is gone (tflab killed) left its knobs on the nodes."""
    note = read_note(lf)
    return note is not None and not pid_alive(note.get("pid"), note.get("pid_start"))
