"""Tools around a lab: TensorBoard over the runs folder, and the host's doctor."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tflab.cli.common import TENSORBOARD_KEY, LabOption, backend, console, open_lab, start_board
from tflab.engine import doctor as doctor_checks
from tflab.engine import guardcmd
from tflab.errors import UserError
from tflab.host.ports import wait_for_http
from tflab.plan import labfile



def tensorboard(
    stop: Annotated[bool, typer.Option("--stop", help="Stop the TensorBoard tflab started.")] = False,
    lab: LabOption = Path("."),
) -> None:
    """Serve the shared runs folder with TensorBoard inside the chief node, published on the host."""
    lf = open_lab(lab)
    side = backend(lf)
    chief = lf.lab.chief
    executor = side.executor([chief.name])
    executor.run(chief.name, guardcmd.stop([TENSORBOARD_KEY], grace_s=2.0))
    if stop:
        console().print(f"stopped TensorBoard on {chief.name}")
        return
    url = start_board(lf, side)
    if not wait_for_http(url, deadline=time.monotonic() + 90):
        raise UserError(f"TensorBoard did not answer at {url} within 90s; its log: "
                        f"`tflab exec {chief.name} -- cat /tmp/tflab-tensorboard.log`")
    console().print(f"TensorBoard for {lf.runs_dir} (as /runs in {chief.name}): {url}")


def schema() -> None:
    """Print tflab.yaml's JSON Schema (`gen` writes it beside the file, which names it for your editor)."""
    sys.stdout.write(json.dumps(labfile.json_schema(), indent=2) + "\n")


def doctor() -> None:
    """Check the engine, compose v2, GPUs, the NVIDIA runtime, link shaping, disk and ports; say how to fix what is missing."""
    checks = doctor_checks.run_checks()
    table = Table(title="tflab doctor")
    for column in ("check", "", "detail", "fix"):
        table.add_column(column)
    marks = {"ok": Text("ok", style="green"), "warn": Text("note", style="yellow"), "fail": Text("MISSING", style="bold red")}
    for check in checks:
        table.add_row(check.name, marks[check.status], Text(check.detail), Text(check.fix))  # plain: `tflab[compose]`
    out = console()
    out.print(table)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        for check in failed:
            out.print(f"missing: {check.name}: {check.detail}; fix: {check.fix}", soft_wrap=True, markup=False)
        raise typer.Exit(1)
    out.print("ready for CPU labs" + ("" if any(c.name == "GPUs" and c.status == "ok" for c in checks) else " (no GPU here)"))


def graph(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to FILE: a picture (.png, .svg) or Mermaid (.mmd); without it, Mermaid on stdout.")] = None,
    lab: LabOption = Path("."),
) -> None:
    """The lab's topology: every node's role, GPUs, CPUs, memory and SSH port, the network's links, a swarm's hosts."""
    from tflab.render import graph as topology_graph

    lf = open_lab(lab)
    if output is None:
        sys.stdout.write(topology_graph.mermaid(lf.lab, lf.config))
        return
    suffix = output.suffix.lower()
    if suffix not in (*topology_graph.PICTURES, topology_graph.MERMAID):
        raise UserError(f"-o {output}: write a picture (.png, .svg) or Mermaid (.mmd), not {suffix or 'no extension'}")
    if not output.parent.is_dir():
        raise UserError(f"-o {output}: no folder {output.parent}")
    if suffix == topology_graph.MERMAID:
        output.write_text(topology_graph.mermaid(lf.lab, lf.config))
    else:
        topology_graph.draw(lf.lab, lf.config, output)
    console().print(f"wrote {output}", markup=False, soft_wrap=True)
