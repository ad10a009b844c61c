"""What every command needs of a lab's engine side, answered alike by a compose lab and a swarm lab.

A `typing.Protocol`: both `ComposeLab` (this host's engine, the compose file) and `SwarmLab`
(a stack on an existing swarm) implement it, so a verb one of them lacks, or answers in
another shape, is a type error rather than a user's "internal error".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from tflab.engine.builds import Progress
from tflab.engine.executors import Executor
from tflab.host.labfiles import LabFiles

VIAS = ("docker", "ssh")


@dataclass(frozen=True)
class NodeState:
    """A node as `status` shows it."""

    state: str  # running | exited (N) | created | absent | a swarm task's state
    health: str = "-"  # healthy | starting | unhealthy | -
    host: str | None = None  # the engine host it runs on, where the lab spans hosts

    @property
    def running(self) -> bool:
        return self.state == "running"


class LabBackend(Protocol):
    """A lab's life and its nodes on one kind of engine."""

    lf: LabFiles

    def up(self, progress: Progress) -> list[str]:
        """Bring the lab up (idempotent); what was copied, as `kind→node`."""

    def down(self) -> tuple[int, int]:
        """Remove everything the lab made on the engine; (nodes, networks) removed."""

    def status(self, checked: bool = False) -> dict[str, NodeState]:
        """Every node the engine knows of, by name; `checked`: with each running node's health as it is now."""

    def executor(self, names: list[str], via: str = "docker") -> Executor:
        """How to run processes in these nodes (each must be running)."""

    def ssh_targets(self) -> dict[str, tuple[str, int]]:
        """Where each running node's SSH is reached from here: (host, port)."""

    def interactive(self, node: str, argv: list[str], via: str = "docker") -> list[str]:
        """The command that gives `argv` in `node` this terminal (`docker exec -it`, or `ssh -t`)."""

    def logs(self, names: list[str], follow: bool, tail: str) -> Iterator[tuple[str, str]]:
        """(node, line) of the nodes' own logs (sshd, the entrypoint); with `follow`, until interrupted."""
