"""Known distributed-TensorFlow failures, read from a failed or stalled node's last output: the cause and the cure.

The catalog is data, `failures.yaml` beside this module (ShellCheck's way: an id, the pattern that
finds it, a cause and a cure, and real lines that it must and must not find, all run by one test).
A run's failed and stalled nodes are matched once the run is decided: a match is kept in run.json
(`nodes.NODE.diagnosis`), and said after the summary as `cause:` and `cure:` lines. The README's
table of it ("When a run fails") is made here too, so the two cannot disagree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from pathlib import Path

import yaml

CATALOG_FILE = "failures.yaml"
TAIL_LINES = 400  # of a node's log: its failure is at its end (a traceback, the errors before it)
WINDOW = 3  # lines a message may go on over (TF1's `... No such file or directory` then `[[{{node save/SaveV2}}]]`)
DIAGNOSED = ("failed", "stalled")  # the verdicts whose node's output is looked at


@dataclass(frozen=True)
class Failure:
    """One known failure."""

    id: str
    pattern: re.Pattern[str]
    cause: str
    cure: str
    seen: tuple[tuple[str, str], ...]  # real output it finds (a line, or a few), and where each was seen
    unlike: tuple[str, ...]  # lines it must not find

    def finds(self, text: str) -> bool:
        """Whether `text` (a line, or a few joined by newlines) shows this failure."""
        return self.pattern.search(text) is not None

    def as_dict(self) -> dict[str, str]:
        """What run.json keeps of it (`nodes.NODE.diagnosis`)."""
        return {"id": self.id, "cause": self.cause, "cure": self.cure}


@lru_cache(maxsize=1)
def catalog() -> tuple[Failure, ...]:
    """Every known failure, in the order they are tried (the specific first)."""
    text = files("tflab.run").joinpath(CATALOG_FILE).read_text()
    return tuple(Failure(id=entry["id"], pattern=re.compile(entry["pattern"]), cause=entry["cause"],
                         cure=entry["cure"], seen=tuple((seen["line"], seen["where"]) for seen in entry["seen"]),
                         unlike=tuple(entry["unlike"]))
                 for entry in yaml.safe_load(text))


def windows(lines: list[str]) -> list[str]:
    """Each line, and each line with the WINDOW - 1 after it (a message that goes on over lines)."""
    return [*lines, *("\n".join(lines[i:i + WINDOW]) for i in range(len(lines) - 1))]


def diagnose(lines: Iterable[str]) -> Failure | None:
    """The first known failure (in the catalog's order) that `lines` show, or None."""
    kept = windows(list(lines))
    for failure in catalog():
        if any(failure.finds(text) for text in kept):
            return failure
    return None


def last_lines(path: Path, count: int = TAIL_LINES) -> list[str]:
    """A node's log's last lines ([] where there is none)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 512 * count))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-count:]


def diagnose_nodes(verdicts: Mapping[str, str], log_dir: Path) -> dict[str, Failure]:
    """The known failure each failed or stalled node's log shows, by node."""
    found = {}
    for node, verdict in verdicts.items():
        if verdict in DIAGNOSED:
            failure = diagnose(last_lines(log_dir / f"{node}.log"))
            if failure is not None:
                found[node] = failure
    return found


def said(diagnoses: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The `cause:` and `cure:` lines after a run's summary, once per failure (naming its nodes)."""
    by_id: dict[str, tuple[list[str], Mapping[str, str]]] = {}
    for node, diagnosis in diagnoses.items():
        by_id.setdefault(diagnosis["id"], ([], diagnosis))[0].append(node)
    lines = []
    for nodes, diagnosis in by_id.values():
        lines.append(f"cause ({', '.join(nodes)}): {diagnosis['cause']}")
        if diagnosis.get("cure"):
            lines.append(f"cure: {diagnosis['cure']}")
    return lines


def markdown_table() -> str:
    """README's table of the catalog: what you see, why, the cure."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    def shown(line: str) -> str:
        line = " ".join(line.split())
        return line if len(line) <= 110 else line[:107] + "..."

    rows = ["| id | what you see, and where it was seen | why | the cure |", "| --- | --- | --- | --- |"]
    for failure in catalog():
        seen = "<br>".join(f"`` {cell(shown(line))} `` ({cell(where)})" for line, where in failure.seen)
        rows.append(f"| `{failure.id}` | {seen} | {cell(failure.cause)} | {cell(failure.cure)} |")
    return "\n".join(rows) + "\n"
