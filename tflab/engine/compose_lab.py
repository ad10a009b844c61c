"""Lab life cycle on one engine: build, up, status, down (the nodes as the lab's compose file says)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import docker
import docker.errors
import yaml
from docker.models.containers import Container

from tflab.engine import compose_up
from tflab.engine.backend import NodeState
from tflab.engine.bringup import (  # noqa: F401  (check_release, down: re-exported for the lab's callers)
    READY_TIMEOUT_S,
    check_links,
    check_release,
    down,
    ensure_image,
    interactive_exec,
    not_ready,
)
from tflab.engine.builds import Progress
from tflab.engine.containers import (
    lab_containers,
    log_lines,
    state_of,
)
from tflab.engine.copying import Copier, docker_target
from tflab.engine.executors import DockerExecutor, Executor, SshExecutor, ssh_argv
from tflab.engine.guardcmd import warm_up
from tflab.errors import UserError
from tflab.host import ports
from tflab.host.labfiles import LabFiles
from tflab.host.ports import wait_for_ssh

def connect_host(bind: str) -> str:
    """Where the host reaches a published port (the wildcard binds are reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


def check_ports_for_absent(lf: LabFiles, containers: dict) -> None:
    """Before starting nodes that are not running, make sure their ports are free."""
    wanted = []
    for node in lf.lab.nodes:
        container = containers.get(node.name)
        if container is not None and container.status == "running":
            continue
        wanted += [(node.name, "SSH", node.ssh_port), (node.name, "TensorBoard", node.tensorboard_port)]
    ports.require_free(lf.lab.topology.bind, wanted)


def up(lf: LabFiles, client: docker.DockerClient, progress: Progress) -> list[str]:
    """Bring the lab up (idempotent): image, nodes, SSH ready, code and data copied, standbys made.

    Each node, as soon as it runs, gets its copy and is waited on, while the others still start.
    """
    built = ensure_image(lf, client, progress)
    lf.write_compose(built.tag)
    lf.runs_dir.mkdir(parents=True, exist_ok=True)
    existing = lab_containers(client, lf.project)
    check_ports_for_absent(lf, existing)
    if any(c.status != "running" for c in existing.values()) or len(existing) < len(lf.lab.nodes):
        check_links(lf, client, built.tag)
    doc = yaml.safe_load(lf.compose_path.read_text())
    host = connect_host(lf.lab.topology.bind)
    ports_of = {n.name: n.ssh_port for n in lf.lab.nodes}
    copier = Copier(lf, progress)
    deadline = time.monotonic() + READY_TIMEOUT_S

    def on_running(name: str, container) -> None:
        copier.copy(name, docker_target(client, container))
        if not wait_for_ssh(host, ports_of[name], deadline):
            raise not_ready(name, (host, ports_of[name]), container)

    progress.step(f"starting {len(lf.lab.nodes)} node{'' if len(lf.lab.nodes) == 1 else 's'}")
    try:
        running = compose_up.start(client, doc, lf.root, lf.project, lf.compose_path, on_running)
    finally:
        copied = copier.finish()
    if lf.warm:
        # Once every node runs: their imports would only slow the others' start.
        warm_up(DockerExecutor(client, running), list(running))
    return copied


def status(lf: LabFiles, client: docker.DockerClient) -> dict[str, NodeState]:
    """Every node the engine has, by node name."""
    return {name: NodeState(*state_of(c)) for name, c in lab_containers(client, lf.project).items()}


def require_running(found: dict[str, Container], names: list[str]) -> dict[str, Container]:
    """The running containers of `names`, or a UserError naming the first that is not."""
    for name in names:
        container = found.get(name)
        if container is None:
            raise UserError(f"node {name} is not up; run `tflab up` first")
        if container.status != "running":
            raise UserError(f"node {name} is {container.status}, not running; `tflab up` starts it again")
    return {name: found[name] for name in names}


class ComposeLab:
    """A lab on this host's engine, as its compose file describes it (a `LabBackend`)."""

    def __init__(self, lf: LabFiles, client: docker.DockerClient) -> None:
        self.lf = lf
        self.client = client

    def up(self, progress: Progress) -> list[str]:
        return up(self.lf, self.client, progress)

    def down(self) -> tuple[int, int]:
        return down(self.lf.project, self.client)

    def status(self) -> dict[str, NodeState]:
        return status(self.lf, self.client)

    def ssh_targets(self) -> dict[str, tuple[str, int]]:
        """Where each node's SSH is published (host, port)."""
        host = connect_host(self.lf.lab.topology.bind)
        return {n.name: (host, n.ssh_port) for n in self.lf.lab.nodes}

    def executor(self, names: list[str], via: str = "docker") -> Executor:
        """How to reach these nodes (all must be running)."""
        containers = require_running(lab_containers(self.client, self.lf.project), names)
        if via == "ssh":
            targets = self.ssh_targets()
            return SshExecutor({name: targets[name] for name in names}, str(self.lf.private_key))
        return DockerExecutor(self.client, containers)

    def interactive(self, node: str, argv: list[str], via: str = "docker") -> list[str]:
        container = require_running(lab_containers(self.client, self.lf.project), [node])[node]
        if via == "ssh":
            return ssh_argv(self.ssh_targets()[node], self.lf.private_key, ["-t"], argv)
        return interactive_exec(container, argv)

    def logs(self, names: list[str], follow: bool, tail: str) -> Iterator[tuple[str, str]]:
        """(node, line) of the nodes' logs, as compose shows them."""
        found = lab_containers(self.client, self.lf.project)
        missing = [name for name in names if name not in found]
        if not names or missing:
            raise UserError(f"node {missing[0] if missing else 'of the lab'} is not up; run `tflab up` first")
        return log_lines({name: found[name] for name in names}, follow, tail)
