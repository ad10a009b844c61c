"""`tflab top`: the lab's nodes, live: CPU of what each owns, memory of its limit, network, GPUs, the task and its steps/s."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tflab.cli.common import LabOption, backend, console, open_lab
from tflab.cli.views import role_text
from tflab.engine.metrics import ClusterSampler, NodeFigures, Snapshot
from tflab.errors import UserError
from tflab.host.labfiles import LabFiles
from tflab.run import history


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _mb(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f}G" if value >= 1024 else f"{value:.0f}M"


def _cpu(figures: NodeFigures | None) -> Text:
    if figures is None or figures.cpu_used is None:
        return Text("-")
    text = f"{figures.cpu_used:.2f}/{figures.cpu_owned:g} {_share(figures.cpu_share)}"
    hot = (figures.cpu_share or 0) >= 0.9
    return Text(text, style="bold red" if hot else "")


def _memory(figures: NodeFigures | None) -> Text:
    if figures is None or figures.memory_mb is None:
        return Text("-")
    if figures.memory_limit_mb is None:
        return Text(f"{_mb(figures.memory_mb)}/-")
    near = (figures.memory_share or 0) >= 0.9
    return Text(f"{_mb(figures.memory_mb)}/{_mb(figures.memory_limit_mb)} {_share(figures.memory_share)}",
                style="bold red" if near else "")


def _net(figures: NodeFigures | None) -> str:
    if figures is None or figures.rx_mbit is None:
        return "-"
    return f"{figures.rx_mbit:.1f}/{figures.tx_mbit:.1f}"


def _gpus(figures: NodeFigures | None) -> str:
    if figures is None or not figures.gpus:
        return "-"
    return "  ".join(f"{g.index}: {g.util:.0f}% {_mb(g.memory_mb)}/{_mb(g.memory_total_mb)}" for g in figures.gpus)


def snapshot_table(lf: LabFiles, snap: Snapshot, activity: dict[str, tuple[str, float | None]]) -> Table:
    """One refresh of `top`."""
    host = f"host CPU {_share(snap.host_busy)} busy of {len(lf.config.host.cpus) or '?'}"
    table = Table(title=f"tflab top: lab {lf.config.name} ({host})",
                  caption="CPU: used/owned CPUs; memory: used/limit; net: Mbit/s in/out on the lab network")
    gpus = any(node.gpus for node in lf.lab.nodes)
    columns = ["node", "role", "CPU", "memory", "net", *(["GPUs"] if gpus else []), "task", "steps/s"]
    for column in columns:
        table.add_column(column, no_wrap=column in ("node", "CPU", "memory", "net"))
    for node in lf.lab.nodes:
        figures = snap.nodes.get(node.name)
        task, rate = activity.get(node.name, ("-", None))
        table.add_row(node.name, role_text(lf.lab, node), _cpu(figures), _memory(figures), _net(figures),
                      *([_gpus(figures)] if gpus else []), task, f"{rate:.1f}" if rate else "-")
    return table


def snapshot_json(lf: LabFiles, snap: Snapshot, activity: dict[str, tuple[str, float | None]]) -> dict[str, Any]:
    """One refresh of `top --json`."""
    nodes = []
    for node in lf.lab.nodes:
        figures = snap.nodes.get(node.name)
        task, rate = activity.get(node.name, (None, None))
        row: dict[str, Any] = figures.as_dict() if figures is not None else {"node": node.name}
        row.update(role=node.job, task=task, steps_per_s=rate)
        nodes.append(row)
    return {"lab": lf.config.name, "time": round(snap.t, 3),
            "host": {"cpus": len(lf.config.host.cpus) or None,
                     "cpu_busy": None if snap.host_busy is None else round(snap.host_busy, 3)},
            "nodes": nodes}


def top(
    once: Annotated[bool, typer.Option("--once", help="Print one table (or one JSON document) and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON for scripts: one document per refresh.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    lab: LabOption = Path("."),
) -> None:
    """The lab's nodes, live: role, CPU of what each owns, memory of its limit, network, GPUs, task and steps/s."""
    if not interval >= 0.2 or interval > 3600:  # nan, inf and the too short alike
        raise UserError(f"--interval must be between 0.2 and 3600 seconds, not {interval}")
    lf = open_lab(lab)
    side = backend(lf)
    running = [name for name, node in side.status().items() if node.running and name in lf.lab.names]
    if not running:
        raise UserError("no node of the lab is running; `tflab up` starts them")
    executor = side.executor(running)
    sampler = ClusterSampler(executor, running, len(lf.config.host.cpus) or 1,
                             {n.name: n.gpus for n in lf.lab.nodes}, every_s=min(interval, 1.0)).start()
    execs = lf.state_dir / "execs"
    out = console()
    try:
        snap = sampler.wait_for_figures(timeout_s=10 + 2 * interval)
        if once:
            activity = history.activity(lf.runs_dir, execs)
            if as_json:
                out.print_json(json.dumps(snapshot_json(lf, snap, activity)))
            else:
                out.print(snapshot_table(lf, snap, activity))
            return
        if as_json:
            while True:
                print(json.dumps(snapshot_json(lf, sampler.snapshot(), history.activity(lf.runs_dir, execs))),
                      flush=True)
                time.sleep(interval)
        with Live(snapshot_table(lf, snap, history.activity(lf.runs_dir, execs)), console=out,
                  refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                live.update(snapshot_table(lf, sampler.snapshot(), history.activity(lf.runs_dir, execs)))
    except KeyboardInterrupt:
        return
    finally:
        sampler.close()
