"""`tflab fault ...`: faults on purpose on a running lab, by hand; `tflab fault clear` heals everything."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from tflab.cli.common import LabOption, backend, console, open_lab
from tflab.engine.backend import LabBackend
from tflab.engine.faults import FaultInjector
from tflab.errors import UserError
from tflab.host.labfiles import LabFiles
from tflab.host.signals import stop_signals
from tflab.plan import faults

app = typer.Typer(help="Faults on purpose on a running lab: kill, stop, restart, pause, slow, cpu, cut; clear heals.",
                  no_args_is_help=True)
ForOption = Annotated[float | None, typer.Option("--for", help="Heal it after this many seconds (Ctrl-C heals at once).")]
NodeArg = Annotated[str, typer.Argument(help="The node.")]


def injector(lf: LabFiles, side: LabBackend | None = None) -> FaultInjector:
    """What does faults to this lab's nodes."""
    return FaultInjector.for_lab(lf, side or backend(lf))


def _do(lab: Path, spec: str, for_s: float | None) -> None:
    lf = open_lab(lab)
    fault = faults.parse(spec + (f" for {for_s:g}s" if for_s is not None else ""), lf.lab.names, timed=False)
    if for_s is not None and for_s <= 0:
        raise UserError("--for must be more than 0 seconds")
    doer = injector(lf)
    out = console()
    out.print(f"tflab: {doer.apply(fault)}")
    if for_s is None:
        if fault.action in faults.TIMED:
            out.print("tflab: it stays so until `tflab fault clear`")
        return
    stopped: list[str] = []

    def on_stop(reason: str, _force: bool) -> None:
        stopped.append(reason)

    deadline = time.monotonic() + for_s
    with stop_signals(on_stop):
        while time.monotonic() < deadline and not stopped:
            time.sleep(0.1)
    out.print(f"tflab: {doer.heal(fault)}" + (f" ({stopped[0]})" if stopped else f" after {for_s:g}s"))


@app.command("kill")
def kill(node: NodeArg, lab: LabOption = Path(".")) -> None:
    """The machine fails: every process of NODE killed (SIGKILL); it stays down until `clear` (or `tflab up`)."""
    _do(lab, f"kill {node}", None)


@app.command("stop")
def stop(node: NodeArg, lab: LabOption = Path(".")) -> None:
    """The machine is shut down (SIGTERM, then SIGKILL); it stays down until `clear` (or `tflab up`)."""
    _do(lab, f"stop {node}", None)


@app.command("restart")
def restart(node: NodeArg, lab: LabOption = Path(".")) -> None:
    """The machine reboots: its processes end, and it comes back."""
    _do(lab, f"restart {node}", None)


@app.command("pause")
def pause(node: NodeArg, for_s: ForOption = None, lab: LabOption = Path(".")) -> None:
    """NODE freezes (the engine's pause: the cgroup freezer)."""
    _do(lab, f"pause {node}", for_s)


@app.command("slow")
def slow(node: NodeArg, rate: Annotated[str, typer.Argument(help="Its link's rate, both ways: 10mbit, 1gbit...")],
         for_s: ForOption = None, lab: LabOption = Path(".")) -> None:
    """NODE's link sends at RATE (needs a lab made with --faults, or with link shaping)."""
    _do(lab, f"slow {node} {rate}", for_s)


@app.command("cpu")
def cpu(node: NodeArg, share: Annotated[float, typer.Argument(help="CPUs' worth of time it may use, e.g. 0.25.")],
        for_s: ForOption = None, lab: LabOption = Path(".")) -> None:
    """NODE gets SHARE CPUs (its CPU quota)."""
    _do(lab, f"cpu {node} {share:g}", for_s)


@app.command("cut")
def cut(node: NodeArg,
        from_: Annotated[str | None, typer.Option("--from", help="Only from these nodes (NODE,NODE; default: all).")] = None,
        for_s: ForOption = None, lab: LabOption = Path(".")) -> None:
    """NODE's traffic with the other nodes is dropped (needs a lab made with --faults, or with link shaping)."""
    _do(lab, f"cut {node}" + (f" from {from_}" if from_ else ""), for_s)


@app.command("clear")
def clear(lab: LabOption = Path(".")) -> None:
    """Heal everything tflab changed: nodes it downed started, paused ones thawed, links and CPU quotas the lab's own."""
    lf = open_lab(lab)
    healed = injector(lf).clear()
    out = console()
    for line in healed:
        out.print(f"tflab: {line}")
    out.print("tflab: every node is as the lab says" if healed else "tflab: nothing to heal")
