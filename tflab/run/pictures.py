"""Pictures of a run, written as it ends: `timeline.png`, `trace.json` and `report.html` in its folder.

- the timeline: a lane per node, from its start to its end: the wait before its first step, its training
  (coloured by its verdict), its steps/s over time, the drill's faults, the end with its verdict;
- the trace, in Chrome's trace event format (Perfetto's UI and chrome://tracing open it): a process per node,
  its phases as duration events, its steps/s as a counter, its end and the faults as instant events;
- the page: one self-contained HTML file (the timeline inside it): the summary, the limit and its evidence, a
  failure's diagnosis and where a node waited, the quality curve, links to each node's log.

Made from what the run's machine knows (run/machine) and run.json (run/runreport). The trace is written as the run
ends, with each node's lane in it; the timeline and the page are drawn from it by a process of their own
(`python -m tflab.run.pictures FOLDER`, matplotlib, headless), so drawing (a second or two, mostly importing the
plotting library) is not on the run's way: both are there a moment after the verdict.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tflab.run.machine import RunMachine
from tflab.run.runreport import RUN_FILE, RunReport
from tflab.run.words import Verdict

TIMELINE, TRACE, REPORT = "timeline.png", "trace.json", "report.html"
RATE_EVERY_S = 2.0  # a lane's steps/s is drawn over windows of this many seconds
GOOD = (Verdict.OK, Verdict.SERVED, Verdict.SURVIVED)
ROLE_WORDS = {"server": "serves", "finisher": "trains", "sidecar": "beside"}
COLOURS = {"good": "#59a14f", "stopped": "#9c9c9c", "bad": "#e15759", "starting": "#d9d9d9"}


@dataclass(frozen=True)
class Lane:
    """One node's part in the run, in seconds since the run began."""

    node: str
    role: str
    start: float | None
    first_step: float | None
    end: float | None
    verdict: str
    how: str  # how it ended: `0`, `1`, `SIGTERM`
    rates: tuple[tuple[float, float], ...]  # (seconds, steps/s) over windows of RATE_EVERY_S
    waits: str | None = None

    @property
    def colour(self) -> str:
        if self.verdict in GOOD:
            return COLOURS["good"]
        return COLOURS["stopped"] if self.verdict in (Verdict.STOPPED, Verdict.INTERRUPTED) else COLOURS["bad"]


def lanes(machine: RunMachine, report: RunReport) -> list[Lane]:
    """Each node's lane, in the plan's order (servers, sidecars, finishers)."""
    began = machine.began or 0.0

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - began, 3)

    out = []
    for name, node in machine.nodes.items():
        steps = node.steps or node.global_steps
        row = report.nodes.get(name)
        how = "-" if node.exit_code is None else str(node.exit_code)
        if node.signal:
            how = node.signal if node.exit_code is None else f"{node.exit_code} {node.signal}"
        out.append(Lane(name, node.role, since(node.started), since(steps[0][0]) if steps else None, since(node.ended),
                        str(node.verdict), how, tuple((round(t - began, 3), r) for t, r in windowed(steps)),
                        row.waits if row is not None else None))
    return out


def windowed(steps: list[tuple[float, int]], every_s: float = RATE_EVERY_S) -> list[tuple[float, float]]:
    """Steps/s over successive windows of `every_s` seconds: (the window's end, its rate)."""
    out: list[tuple[float, float]] = []
    if len(steps) < 2:
        return out
    (t0, s0) = steps[0]
    for t, s in steps[1:]:
        if t - t0 >= every_s and s >= s0:
            out.append((t, (s - s0) / (t - t0)))
            t0, s0 = t, s
    return out


def trace(task: str, found: list[Lane], report: RunReport) -> dict[str, Any]:
    """Chrome's trace event format: a process per node (pid by its order), times in microseconds."""
    events: list[dict[str, Any]] = []

    def us(seconds: float) -> int:
        return int(seconds * 1e6)

    for pid, lane in enumerate(found, start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{lane.node} ({ROLE_WORDS.get(lane.role, lane.role)})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        if lane.start is None:
            continue
        end = lane.end if lane.end is not None else max([lane.start, *(t for t, _r in lane.rates)])
        split = lane.first_step if lane.first_step is not None else end
        events.append({"name": "before its first step" if lane.first_step is not None else "no step",
                       "cat": "phase", "ph": "X", "pid": pid, "tid": 0, "ts": us(lane.start),
                       "dur": max(0, us(split - lane.start))})
        if lane.first_step is not None:
            events.append({"name": "training", "cat": "phase", "ph": "X", "pid": pid, "tid": 0,
                           "ts": us(lane.first_step), "dur": max(0, us(end - lane.first_step))})
        for t, rate in lane.rates:
            events.append({"name": "steps/s", "ph": "C", "pid": pid, "tid": 0, "ts": us(t), "args": {"steps/s": round(rate, 3)}})
        events.append({"name": f"end: {lane.verdict} ({lane.how})", "cat": "end", "ph": "i", "s": "p", "pid": pid,
                       "tid": 0, "ts": us(end), "args": {"verdict": lane.verdict, "ended": lane.how,
                                                        **({"waits": lane.waits} if lane.waits else {})}})
    for fault in report.faults:
        if fault.get("hit_s") is not None:
            events.append({"name": f"fault: {fault.get('what')}", "cat": "fault", "ph": "i", "s": "g", "pid": 0,
                           "tid": 0, "ts": us(float(fault["hit_s"])), "args": {k: v for k, v in fault.items() if v is not None}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"task": task, "verdict": report.verdict, "duration_s": report.duration_s,
                          "lanes": [asdict(lane) for lane in found]}}


def timeline_png(task: str, found: list[Lane], report: RunReport) -> bytes:
    """The run's timeline as a PNG: a lane per node."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 1.1 + 0.62 * max(1, len(found))))
    top = max([t for lane in found for t in (lane.start, lane.end) if t is not None] + [1.0])
    peak = max([rate for lane in found for _t, rate in lane.rates] + [1e-9])
    for y, lane in enumerate(reversed(found)):
        if lane.start is None:
            axes.text(0, y, "  never started", va="center", fontsize=8, color="#666")
            continue
        end = lane.end if lane.end is not None else top
        first = lane.first_step if lane.first_step is not None else end
        if lane.role != "finisher":  # a server (a sidecar) serves from its start: no step to wait for
            axes.barh(y, end - lane.start, left=lane.start, height=0.5, color=lane.colour, alpha=0.3, edgecolor="#555")
            axes.text(end, y + 0.32, f" {lane.verdict} ({lane.how})", fontsize=8, va="bottom")
            continue
        axes.barh(y, first - lane.start, left=lane.start, height=0.5, color=COLOURS["starting"], edgecolor="#999")
        if lane.first_step is not None:
            axes.barh(y, end - first, left=first, height=0.5, color=lane.colour, alpha=0.55, edgecolor="#555")
            axes.plot([first], [y], marker="o", color="#333", markersize=4)
        if lane.rates:  # steps/s drawn inside the lane, scaled to the run's fastest
            xs = [t for t, _r in lane.rates]
            ys = [y - 0.22 + 0.44 * r / peak for _t, r in lane.rates]
            axes.plot(xs, ys, color="#1f3b73", linewidth=1.2)
        axes.text(end, y + 0.32, f" {lane.verdict} ({lane.how})", fontsize=8, va="bottom",
                  color="#b00" if lane.colour == COLOURS["bad"] else "#222")
    for fault in report.faults:
        if fault.get("hit_s") is not None:
            axes.axvline(float(fault["hit_s"]), color="#d62728", linestyle="--", linewidth=1)
            axes.text(float(fault["hit_s"]), len(found) - 0.4, f" {fault.get('what')}", color="#d62728", fontsize=8)
    axes.set_yticks(range(len(found)))
    axes.set_yticklabels([f"{lane.node} ({ROLE_WORDS.get(lane.role, lane.role)})" for lane in reversed(found)],
                         fontsize=9)
    axes.set_xlim(0, top * 1.12)
    axes.set_ylim(-0.7, len(found) - 0.2)
    axes.set_xlabel("seconds since the run began (grey: before its first step; the line: steps/s, scaled)")
    axes.set_title(f"run {task}: {report.verdict or report.state}"
                   + (f", {report.steps_per_s:.1f} steps/s" if report.steps_per_s else ""), fontsize=11)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def page(task: str, found: list[Lane], report: RunReport, timeline: bytes | None) -> str:
    """One self-contained HTML page of the run (it opens offline, from the file)."""
    def esc(value: Any) -> str:
        return html.escape("" if value is None else str(value))

    rows = "".join(
        f"<tr><td>{esc(lane.node)}</td><td>{esc(ROLE_WORDS.get(lane.role, lane.role))}</td><td>{esc(lane.how)}</td>"
        f"<td>{esc(None if lane.start is None or lane.end is None else f'{lane.end - lane.start:.1f}s')}</td>"
        f"<td>{esc(_rate(report, lane.node))}</td><td class='{'good' if lane.verdict in GOOD else 'bad'}'>"
        f"{esc(lane.verdict)}</td><td><a href='logs/{esc(lane.node)}.log'>log</a></td></tr>" for lane in found)
    limit = report.limit or {}
    parts = [f"<h1>run {esc(task)}: {esc(report.verdict or report.state)}</h1>",
             f"<p>{esc(report.problem or '')}</p>" if report.problem else "",
             "<table><tr><th>node</th><th>role</th><th>exit</th><th>duration</th><th>steps/s</th><th>verdict</th>"
             f"<th></th></tr>{rows}</table>"]
    if report.steps_per_s:
        parts.append(f"<p>cluster: {report.steps_per_s:.1f} steps/s"
                     f"{' (the global step)' if report.steps_are_global else ' (the chief)'}</p>")
    if timeline:
        parts.append(f"<h2>timeline</h2><img alt='timeline' src='data:image/png;base64,"
                     f"{base64.b64encode(timeline).decode()}'>")
    if limit.get("kind"):
        parts.append(f"<h2>what limited it</h2><p><b>{esc(limit.get('kind'))}</b>: {esc(limit.get('evidence'))}</p>")
    diagnosed = [(name, row.diagnosis) for name, row in report.nodes.items() if row.diagnosis]
    waited = [(name, row) for name, row in report.nodes.items() if row.waits or row.stack]
    if diagnosed or waited:
        parts.append("<h2>why</h2>")
        for name, diagnosis in diagnosed:
            parts.append(f"<p><b>{esc(name)}</b>: {esc(diagnosis.get('cause'))}"
                         + (f"<br>cure: {esc(diagnosis.get('cure'))}" if diagnosis.get("cure") else "") + "</p>")
        for name, row in waited:
            parts.append(f"<p><b>where {esc(name)} waited</b>: {esc(row.waits)}</p>"
                         + (f"<details><summary>its stacks (py-spy)</summary><pre>{esc(row.stack)}</pre></details>"
                            if row.stack else ""))
    if report.quality_series:
        parts.append("<h2>quality</h2>" + _quality_svg(report.quality_series))
    parts.append("<p>files: <a href='run.json'>run.json</a>, <a href='trace.json'>trace.json</a> (Perfetto, "
                 "chrome://tracing), <a href='output.log'>output.log</a></p>")
    style = ("body{font-family:sans-serif;margin:2em;max-width:1150px} table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px} .good{color:#2a7} .bad{color:#c33} img{max-width:100%}"
             "pre{background:#f6f6f6;padding:8px;overflow:auto}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>run {esc(task)}</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>\n")


def _rate(report: RunReport, node: str) -> str:
    row = report.nodes.get(node)
    if row is None:
        return "-"
    if row.steps_per_s:
        return f"{row.steps_per_s:.1f}"
    return f"{row.global_steps_per_s:.1f} (global)" if row.global_steps_per_s else "-"


def _quality_svg(series: dict[str, list[Any]]) -> str:
    """Each metric's curve as an inline SVG polyline (no picture library, no network)."""
    out = []
    for metric, points in series.items():
        if len(points) < 2:
            continue
        xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        width, height = 520, 140

        def px(x: float, y: float) -> str:
            return (f"{10 + (x - x0) / ((x1 - x0) or 1) * (width - 20):.1f},"
                    f"{height - 10 - (y - y0) / ((y1 - y0) or 1) * (height - 20):.1f}")

        path = " ".join(px(x, y) for x, y in zip(xs, ys))
        out.append(f"<p>{html.escape(metric)}: {ys[0]:.4g} → {ys[-1]:.4g} over {x1 - x0:.0f}s</p>"
                   f"<svg width='{width}' height='{height}' style='border:1px solid #ddd'>"
                   f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{path}'/></svg>")
    return "".join(out)


def write(folder: Path, task: str, machine: RunMachine, report: RunReport, draw_now: bool = False) -> None:
    """trace.json in the run's folder now; timeline.png and report.html drawn from it by a process of their own (or
    here, with `draw_now`). The drawer is handed the folder itself, open: a next run of the task that moves it aside
    (runs/TASK.<time>) moves it from under the drawer's path, not from its hands."""
    (folder / TRACE).write_text(json.dumps(trace(task, lanes(machine, report), report)))
    if draw_now:
        draw(folder)
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        subprocess.Popen([sys.executable, "-m", "tflab.run.pictures", str(fd)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(fd,))
    finally:
        os.close(fd)


def draw(folder: Path) -> None:
    """timeline.png and report.html from the folder's trace.json and run.json."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        draw_in(fd)
    finally:
        os.close(fd)


def draw_in(folder_fd: int) -> None:
    """draw() in the folder open as `folder_fd` (wherever it is by now)."""
    def read(name: str) -> bytes:
        handle = os.open(name, os.O_RDONLY, dir_fd=folder_fd)
        with os.fdopen(handle, "rb") as stream:
            return stream.read()

    def write_file(name: str, data: bytes) -> None:
        handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=folder_fd)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)

    data = json.loads(read(TRACE))
    report = RunReport.from_json(json.loads(read(RUN_FILE)))
    if report is None:
        return
    found = [Lane(**{**lane, "rates": tuple(tuple(pair) for pair in lane["rates"])})
             for lane in data["otherData"]["lanes"]]
    task = data["otherData"]["task"]
    picture = timeline_png(task, found, report)
    write_file(TIMELINE, picture)
    write_file(REPORT, page(task, found, report, picture).encode())


if __name__ == "__main__":
    draw_in(int(sys.argv[1]))
