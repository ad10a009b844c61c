"""Commands that drive a lab's life: base, build, up, status, logs, down."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from tflab.cli import views
from tflab.cli.common import LabOption, backend, board_serves, board_url, console, open_lab, progress
from tflab.engine import compose_lab as lab_ops
from tflab.engine import bringup, copying, daemon, local_base, node_image, packages
from tflab.engine.backend import LabBackend
from tflab.errors import TflabError, UserError
from tflab.render import image_files
from tflab.host import buildsettings, labfiles, proc
from tflab.host.signals import stopping_as_interrupted
from tflab.host.labfiles import LabFiles
from tflab.plan.config import check_task_name
from tflab.plan.progress import displayed
from tflab.run import history, runreport


def base(
    gpu: Annotated[bool, typer.Option(help="Build the GPU variant (tensorflow[and-cuda]).")] = False,
    force: Annotated[bool, typer.Option(help="Build again even if it exists.")] = False,
    ca_bundle: Annotated[str | None, typer.Option(help="CA bundle pip must trust (default: the host's).")] = None,
    index_url: Annotated[str | None, typer.Option(help="pip index to use (default: the host's pip setting).")] = None,
    tensorflow: Annotated[str | None, typer.Option(help="pip requirement for TensorFlow (default tensorflow-cpu).")] = None,
    tag: Annotated[str | None, typer.Option(help="Tag the base as this (default tflab-base:cpu, or :gpu); labs use it with --base TAG.")] = None,
) -> None:
    """Build the local base image (mmdebstrap or debootstrap, then pip) for hosts with no container registry."""
    client = daemon.client()
    mirror = buildsettings.parse_apt_sources(buildsettings.read_apt_sources())
    pip = buildsettings.pip_settings(proc.run, os.environ, ca_bundle, index_url)
    with progress("base image") as report, stopping_as_interrupted():
        result = local_base.build_base(client, mirror, pip, report, gpu=gpu, force=force, tensorflow=tensorflow,
                                       tag=tag)
    if result.built:
        console().print(f"built {result.tag} ({result.image_id[7:19]}) from {buildsettings.without_credentials(mirror.uri)} {mirror.suite}; log: {result.log}")
    else:
        console().print(f"{result.tag} is up to date ({result.image_id[7:19]})")


def build(
    force: Annotated[bool, typer.Option(help="Build again even if the image exists.")] = False,
    bake: Annotated[bool, typer.Option(help="Also make an image with the lab's code in /workspace (and its data in /data), for Kubernetes.")] = False,
    tag: Annotated[str | None, typer.Option(help="With --bake: the baked image's tag (default tflab-baked:HASH).")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Build the lab's node image (skipped when an image of the same inputs exists)."""
    lf = open_lab(lab)
    client = daemon.client()
    with progress("node image") as report, stopping_as_interrupted():
        result = lab_ops.ensure_image(lf, client, report, force=force)
        if bake:
            folders = {sync.target: sync.source for sync in copying.syncs(lf)}
            baked = node_image.bake(client, result.tag, folders, tag, report)
    if lf.config.target == "compose":
        lf.write_compose(result.tag)
    if bake:
        console().print(f"{'baked' if baked.built else 'up to date:'} {baked.tag} ({baked.image_id[7:19]}): "
                        f"{' and '.join(sorted(folders))} inside; `tflab render k8s --image {baked.tag}` "
                        "once it is pushed where the cluster pulls from", soft_wrap=True)
        return
    if result.built:
        how = f"log: {result.log}" if result.log else "tflab's base carries the node's files: nothing to build"
        console().print(f"built {result.tag} ({result.image_id[7:19]}); {how}")
    else:
        console().print(f"{result.tag} is up to date ({result.image_id[7:19]})")


def up(lab: LabOption = Path(".")) -> None:
    """Start the lab: build if needed, start nodes, wait for sshd, copy code and data."""
    lf = open_lab(lab)
    side = backend(lf)
    with progress("up") as report, stopping_as_interrupted():
        copied = side.up(report)
    out = console()
    out.print(views.status_table(lf.lab, side.status(checked=True), lf.lab.topology.bind, lf.config.links,
                                 swarm=lf.config.target == "swarm"))
    if copied:
        out.print(copied_text(copied, lf.lab.names), soft_wrap=True)
    out.print(f"ready: {plural(len(lf.lab.nodes), 'node')}; shared runs folder {lf.runs_dir}")


def copied_text(copied: list[str], names: list[str]) -> str:
    """`code→ps0, data→worker1, ...` as a sentence: what went into which nodes, in the lab's order."""
    into: dict[str, list[str]] = {}
    for item in copied:
        what, _, node = item.partition("→")
        into.setdefault(what, []).append(node)
    parts = []
    for what, nodes in into.items():
        ordered = [n for n in names if n in nodes] + sorted(n for n in nodes if n not in names)
        parts.append(f"{what} into {'every node' if ordered == list(names) else ', '.join(ordered)}")
    return "copied " + "; ".join(parts)


def status(lab: LabOption = Path(".")) -> None:
    """Each node's state and health, GPUs, ports and links."""
    lf = open_lab(lab)
    side = backend(lf)
    states = side.status(checked=True)
    out = console()
    out.print(views.status_table(lf.lab, states, lf.lab.topology.bind, lf.config.links,
                                 swarm=lf.config.target == "swarm"))
    if any(state.running for state in states.values()):
        url = board_url(lf, side)
        out.print(f"TensorBoard: {url} (serving)" if board_serves(url) else
                  f"TensorBoard: {url} (not running: `tflab tensorboard` starts it, as every `tflab run` does)",
                  markup=False, soft_wrap=True)
    picture = views.gpu_map(lf.lab, lf.config.gpus)
    if picture is not None:
        out.print(picture)
    if not states:
        out.print("the lab is not up (`tflab up` starts it)")
        return
    running = [name for name, state in states.items() if state.running and name in lf.lab.names]
    if running:
        out.print(image_packages(side, running[0]), soft_wrap=True)


def image_packages(side: LabBackend, node: str) -> str:
    """What the running node image holds of the lab's own: its packages, pinned TensorFlow and Keras 2, as built."""
    try:
        code, text = side.executor([node], "docker").run(node, ["cat", f"{packages.SHARE}/{image_files.PACKAGES_FILE}"])
        doc = json.loads(text) if code == 0 else {}
    except (TflabError, ValueError):
        return f"packages: cannot read them in {node}'s image"
    parts = [f"pip: {', '.join(doc['pip'])}" if doc.get("pip") else "",
             f"apt: {', '.join(doc['apt'])}" if doc.get("apt") else "",
             f"TensorFlow {doc['tensorflow']} (pinned)" if doc.get("tensorflow") else "",
             "Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1)" if doc.get("keras") == 2 else ""]
    said = "; ".join(p for p in parts if p)
    return f"packages in the running image: {said}" if said else "packages in the running image: none of the lab's own"


def logs(
    node: Annotated[str | None, typer.Argument(help="One node (default: every node).")] = None,
    task: Annotated[str | None, typer.Option("--task", help="That task's run (default: the lab's latest run).")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following, to the run's end.")] = False,
    tail: Annotated[str, typer.Option(help="Lines from the end of each log.")] = "all",
    engine: Annotated[bool, typer.Option("--engine", help="The engine's logs of the nodes instead (sshd, the entrypoint).")] = False,
    lab: LabOption = Path("."),
) -> None:
    """The program output of the lab's latest run (or TASK's), as runs/TASK/logs/ keeps it; --engine: the nodes' own."""
    lf = open_lab(lab)
    if tail != "all" and not (tail.isascii() and tail.isdigit()):
        raise UserError(f"--tail must be a number of lines or all, not {tail!r}")
    if node is not None:
        lf.lab.node(node)
    if engine:
        engine_logs(lf, node, follow, tail)
        return
    folder = run_folder(lf, task)
    names = [node] if node is not None else [n for n in lf.lab.names if (folder / history.LOG_DIR / f"{n}.log").is_file()]
    out = console()
    out.print(f"{folder / history.LOG_DIR} (the run's program output; `--engine` for the nodes' own logs)",
              style="dim", markup=False, soft_wrap=True)
    width = max(len(name) for name in names) if names else 0
    offsets = {name: 0 for name in names}
    try:
        while True:
            for name in names:
                lines, offsets[name] = new_lines(folder / history.LOG_DIR / f"{name}.log", offsets[name],
                                                 None if tail == "all" or offsets[name] else int(tail))
                for line in lines:
                    out.print(Text(f"{name:<{width}} | ") + Text(line), soft_wrap=True)
            report = runreport.load(folder)
            if not follow or report is None or report.finished or not report.is_live():
                return
            time.sleep(0.5)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def run_folder(lf: LabFiles, task: str | None) -> Path:
    """TASK's run folder, or the latest run's; a UserError naming the runs there are where there is none."""
    if task is not None:
        folder = lf.runs_dir / check_task_name(task)
        if not (folder / history.LOG_DIR).is_dir():
            raise UserError(f"no run of {task} in {lf.runs_dir} (`tflab run {task}` makes one)")
        return folder
    current = [(folder, report) for folder, report in history.all_runs(lf.runs_dir) if folder.name == report.task]
    if not current:
        raise UserError(f"no run yet in {lf.runs_dir} (`tflab run TASK` makes one; `tflab logs --engine` shows the "
                        "nodes' own logs)")
    return current[-1][0]


def new_lines(path: Path, offset: int, last: int | None) -> tuple[list[str], int]:
    """The whole lines of `path` after byte `offset` (its last `last` only, when given), each as a terminal leaves it
    (a progress bar's redraws: its last state), and the offset after them."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    lines = [displayed(line) for line in data[:end].decode(errors="replace").split("\n")[:-1]]
    return (lines[-last:] if last is not None else lines), offset + end


def engine_logs(lf: LabFiles, node: str | None, follow: bool, tail: str) -> None:
    """The engine's logs of the nodes (sshd and anything the entrypoint printed), each line after its node's name."""
    side = backend(lf)
    names = [node] if node is not None else [name for name in lf.lab.names if name in side.status()]
    width = max(len(name) for name in names) if names else 0
    out = console()
    try:
        for name, line in side.logs(names, follow, tail):
            out.print(Text(f"{name:<{width}} | ") + Text(line), soft_wrap=True)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def down_by_label(lab: Path, unreadable: UserError) -> None:
    """`down` of a lab whose tflab.yaml cannot be read: what is labelled with the project gen recorded goes."""
    root = lab.resolve()
    project = labfiles.recorded_project(root)
    if project is None:
        raise UserError(f"{unreadable}; and {root} keeps no record of its lab's project (.tflab/identity.json), so "
                        "tflab cannot tell its containers: fix tflab.yaml, or `docker ps --filter label=tflab.lab` "
                        "lists every lab's")
    with progress("down") as report:
        report.step(f"removing what is labelled tflab.lab={project} (tflab.yaml cannot be read: {unreadable})")
        removed, networks = bringup.down(project, daemon.client())
    console().print(f"removed {plural(removed, 'node')} and {plural(networks, 'network')} of {project}; fix "
                    f"{root / 'tflab.yaml'} before the next `tflab up`", markup=False, soft_wrap=True)


def plural(count: int, noun: str) -> str:
    """`1 node`, `4 nodes`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def down(lab: LabOption = Path(".")) -> None:
    """Stop and remove every container and network of the lab (the runs folder stays); a run going is stopped first."""
    try:
        lf = open_lab(lab)
    except UserError as unreadable:
        down_by_label(lab, unreadable)
        return
    for folder, going in history.all_runs(lf.runs_dir):
        if going.finished or not going.is_live() or going.pid is None:
            continue
        console().print(f"stopping run {going.task} first (pid {going.pid}): it is recorded `stopped`", markup=False)
        os.kill(going.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (runreport.load(folder) or going).finished:
            time.sleep(0.2)
    with progress("down") as report:
        report.step(f"removing lab '{lf.config.name}' ({lf.project}): its nodes and network")
        removed, networks = backend(lf).down()
    if removed or networks:
        console().print(f"removed {plural(removed, 'node')} and {plural(networks, 'network')}; "
                        f"outputs stay in {lf.runs_dir}")


def labs() -> None:
    """The labs on this host: those generated here (name, folder, nodes, how many run, SSH ports), and any the engine
    runs that no folder here names."""
    from rich.table import Table

    from tflab.engine.containers import labelled
    from tflab.host import labindex

    running: dict[str, list[bool]] = {}
    engine_note = ""
    try:
        for container in labelled(daemon.client(), "tflab.lab"):
            running.setdefault(container.labels.get("tflab.lab", "?"), []).append(container.status == "running")
    except TflabError as exc:
        engine_note = f" (the engine cannot be asked: {exc})"
    table = Table(title=f"tflab labs on this host{engine_note}")
    for column in ("lab", "folder", "nodes", "up", "SSH"):
        table.add_column(column, overflow="fold")
    seen = set()
    for root in labindex.roots():
        try:
            lf = labfiles.open_lab(root)
        except UserError:
            table.add_row("?", str(root), "-", "-", "(its tflab.yaml cannot be read)")
            continue
        seen.add(lf.project)
        states = running.get(lf.project, [])
        up = f"{sum(states)} of {len(lf.lab.nodes)}" if states else "down"
        ports = [n.ssh_port for n in lf.lab.nodes]
        table.add_row(lf.config.name, str(root), str(len(lf.lab.nodes)), up, f"{min(ports)}-{max(ports)}")
    for project, states in sorted(running.items()):
        if project not in seen:
            table.add_row(project, "(no folder here names it)", str(len(states)), f"{sum(states)} of {len(states)}", "-")
    console().print(table)
