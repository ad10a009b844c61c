"""What the CLI shows: tables and the GPU map, as Rich renderables (no printing here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text

from tflab.gpus import Gpu
from tflab.model import Lab, Node

NODE_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def gpu_text(node: Node) -> str:
    """A node's GPUs as a short list (`0,1`, or `-` for a CPU node)."""
    text = ",".join(str(g) for g in node.gpus) or "-"
    if node.gpu_memory_fraction is not None:
        text += f" ({node.gpu_memory_fraction:.0%})"
    return text


def role_text(lab: Lab, node: Node) -> str:
    """The node's role, saying which one is the chief."""
    return f"{node.job} (chief)" if node is lab.chief and node.job != "chief" else node.job


def lab_table(lab: Lab, bind: str, title: str | None = None) -> Table:
    """node, role, GPUs, SSH port, TensorBoard port: what `gen` prints."""
    table = Table(title=title, caption=f"ports are published on {bind}")
    for column in ("node", "role", "GPUs", "SSH", "TensorBoard"):
        table.add_column(column)
    for node in lab.nodes:
        table.add_row(
            node.name, role_text(lab, node), gpu_text(node), str(node.ssh_port), str(node.tensorboard_port)
        )
    return table


def gpu_map(lab: Lab, host_gpus: Sequence[Gpu]) -> Text | None:
    """A picture of which host GPU belongs to which node; None for a CPU lab."""
    if not host_gpus or not any(n.gpus for n in lab.nodes):
        return None
    owners: dict[int, list[int]] = {}
    for number, node in enumerate(lab.nodes):
        for gpu in node.gpus:
            owners.setdefault(gpu, []).append(number)
    picture = Text("GPU map\n", style="bold")
    for gpu in host_gpus:
        picture.append(f"  GPU {gpu.index:<2} ")
        users = owners.get(gpu.index, [])
        if not users:
            picture.append("[ free ]", style="dim")
        for number in users:
            node = lab.nodes[number]
            picture.append(f"[{node.name:^9}]", style=f"bold black on {NODE_COLOURS[number % len(NODE_COLOURS)]}")
        if gpu.name:
            picture.append(f"  {gpu.name}", style="dim")
        picture.append("\n")
    return picture


def status_table(lab: Lab, states: Mapping[str, tuple[str, str]], bind: str) -> Table:
    """node, role, GPUs, state, health, ports: what `status` prints."""
    table = Table(caption=f"ports are published on {bind}")
    for column in ("node", "role", "GPUs", "state", "health", "SSH", "TensorBoard"):
        table.add_column(column)
    for node in lab.nodes:
        state, health = states.get(node.name, ("absent", "-"))
        colour = "green" if state == "running" and health in ("healthy", "-") else "red"
        if health == "starting":
            colour = "yellow"
        table.add_row(
            node.name,
            role_text(lab, node),
            gpu_text(node),
            Text(state, style=colour),
            Text(health, style=colour),
            str(node.ssh_port),
            str(node.tensorboard_port),
        )
    return table
