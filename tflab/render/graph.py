"""The lab's topology as a picture: Mermaid text, or a PNG or SVG drawn with matplotlib (`tflab graph`).

Every node with its role, GPUs, CPUs and memory, and its published SSH port; the lab network with its link rate and
delay; the traffic's shape (each worker to each parameter server, or the workers' all-reduce ring); for a swarm lab,
the host each node is placed on. Pure but for `draw`, which writes the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tflab.plan import shares
from tflab.plan.config import LabConfig
from tflab.plan.topology import Lab, Node

PICTURES = (".png", ".svg")
MERMAID = ".mmd"
ROLE_COLOURS = {"ps": "#f6c85f", "chief": "#9dd9d2", "worker": "#6f9fd8", "evaluator": "#c3a6e0"}


@dataclass(frozen=True)
class Box:
    """One node as drawn: its name, what it is and owns, where it is placed."""

    name: str
    role: str
    lines: tuple[str, ...]
    host: str | None


def boxes(lab: Lab, config: LabConfig) -> list[Box]:
    """Each node's box, in the lab's order."""
    chief = lab.chief
    out = []
    for node in lab.nodes:
        role = f"{node.job} (chief)" if node is chief and node.job != "chief" else node.job
        out.append(Box(node.name, node.job, (role, f"GPUs {_gpus(node)}", f"CPUs {_cpus(node)}",
                                             f"memory {shares.memory_text(node.share.memory_mib)}",
                                             f"SSH {lab.topology.bind}:{node.ssh_port}"),
                       config.swarm.place.get(node.name) if config.target == "swarm" else None))
    return out


def _gpus(node: Node) -> str:
    text = ",".join(str(g) for g in node.gpus) or "-"
    return text + (f" ({node.gpu_memory_fraction:.0%})" if node.gpu_memory_fraction is not None else "")


def _cpus(node: Node) -> str:
    share = node.share
    if share.cpuset:
        return shares.cpu_list(share.cpuset)
    if share.quota is not None:
        return f"{share.quota:g} (quota)"
    return "shared"


def edges(lab: Lab) -> list[tuple[str, str]]:
    """Who talks to whom: each worker (chief, evaluator) to each parameter server; without one, the all-reduce ring."""
    servers = [n.name for n in lab.nodes if n.job == "ps"]
    others = [n.name for n in lab.nodes if n.job != "ps"]
    if servers:
        return [(other, server) for other in others for server in servers]
    ring = [n.name for n in lab.nodes if n.job in ("chief", "worker")]
    return [(a, b) for a, b in zip(ring, ring[1:] + ring[:1])] if len(ring) > 1 else []


def network_text(config: LabConfig) -> str:
    """`lab network: 100mbit, 5 ms delay on every node's link, both ways`."""
    shaped = config.links
    if shaped:
        return f"lab network: {shaped.describe()} on every node's link, both ways"
    return "lab network: unshaped (memory speed between containers)"


def mermaid(lab: Lab, config: LabConfig) -> str:
    """The topology as a Mermaid flowchart."""
    drawn = boxes(lab, config)
    lines = ["flowchart TB", f'  subgraph lab["{config.name}: {network_text(config)}"]']
    hosts: dict[str | None, list[Box]] = {}
    for box in drawn:
        hosts.setdefault(box.host, []).append(box)
    for host, members in hosts.items():
        indent = "    "
        if host is not None:
            lines.append(f'    subgraph host_{_ident(host)}["host {host}"]')
            indent = "      "
        for box in members:
            label = "<br/>".join((f"<b>{box.name}</b>", *box.lines))
            lines.append(f'{indent}{_ident(box.name)}["{label}"]:::{box.role}')
        if host is not None:
            lines.append("    end")
    lines.append("  end")
    arrow = "<-->" if not any(n.job == "ps" for n in lab.nodes) else "-->"
    lines += [f"  {_ident(a)} {arrow} {_ident(b)}" for a, b in edges(lab)]
    lines += [f"  classDef {role} fill:{colour},stroke:#333" for role, colour in ROLE_COLOURS.items()]
    return "\n".join(lines) + "\n"


def _ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def positions(lab: Lab) -> dict[str, tuple[float, float]]:
    """Where each node's box goes: the parameter servers in a row on top, the rest in a row under them."""
    rows: Mapping[str, list[str]] = {
        "top": [n.name for n in lab.nodes if n.job == "ps"],
        "bottom": [n.name for n in lab.nodes if n.job != "ps"],
    }
    width = max(len(r) for r in rows.values()) or 1
    placed = {}
    for y, names in ((1.0, rows["top"]), (0.0, rows["bottom"])):
        for i, name in enumerate(names):
            placed[name] = ((i + 0.5) * width / len(names), y if rows["top"] else 0.5)
    return placed


def draw(lab: Lab, config: LabConfig, path: Path) -> None:
    """The topology as a picture, PNG or SVG by `path`'s extension (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    drawn = boxes(lab, config)
    where = positions(lab)
    width = max(1, max(sum(1 for n in lab.nodes if n.job == "ps"), sum(1 for n in lab.nodes if n.job != "ps")))
    figure, axes = plt.subplots(figsize=(max(6.0, 2.6 * width), 5.0))
    axes.set_xlim(-0.1, width + 0.1)
    axes.set_ylim(-0.55, 1.55)
    axes.axis("off")
    for a, b in edges(lab):
        (x0, y0), (x1, y1) = where[a], where[b]
        axes.plot([x0, x1], [y0, y1], color="#888", linewidth=1.2, zorder=1)
    for box in drawn:
        x, y = where[box.name]
        axes.add_patch(FancyBboxPatch((x - 0.42, y - 0.36), 0.84, 0.72, boxstyle="round,pad=0.02",
                                      facecolor=ROLE_COLOURS.get(box.role, "#ddd"), edgecolor="#333", zorder=2))
        head = box.name + (f"  @ {box.host}" if box.host else "")
        axes.text(x, y + 0.24, head, ha="center", va="center", fontsize=10, fontweight="bold", zorder=3)
        axes.text(x, y - 0.06, "\n".join(box.lines), ha="center", va="center", fontsize=7.5, zorder=3)
    axes.set_title(f"{config.name}: {len(drawn)} nodes; {network_text(config)}", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
