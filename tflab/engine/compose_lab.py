"""A lab on this host's engine, its nodes as its compose file says: the stages of its bring-up, status, exec, down."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import docker.errors
import yaml
from docker.models.containers import Container

from tflab.engine import compose_up
from tflab.engine.backend import NodeState
from tflab.engine.bringup import (
    NodeImage,
    OnRunning,
    RunningNode,
    bring_up,
    down,
    ensure_image,
    interactive_exec,
)
from tflab.engine.builds import Progress
from tflab.engine.containers import (
    lab_containers,
    log_lines,
    sshd_health,
    state_of,
)
from tflab.engine.copying import docker_target
from tflab.engine.executors import DockerExecutor, Executor, SshExecutor, ssh_argv
from tflab.errors import UserError
from tflab.host import ports
from tflab.host.fanout import parallel
from tflab.host.labfiles import LabFiles

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


def status(lf: LabFiles, client: docker.DockerClient, checked: bool = False) -> dict[str, NodeState]:
    """Every node the engine has, by node name; `checked`: each running node's health asked now (sshd_health)."""
    found = lab_containers(client, lf.project)
    states = {name: NodeState(*state_of(c)) for name, c in found.items()}
    if checked:
        running = [name for name, state in states.items() if state.running]
        for name, health in zip(running, parallel(lambda n: sshd_health(client, found[n]), running)):
            states[name] = NodeState(states[name].state, health)
    return states


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
        """Bring the lab up (idempotent): image, nodes, SSH ready, code and data copied, standbys made."""
        return bring_up(self.lf, self.client, self, progress)

    # -- the stages of bring_up ----------------------------------------------------------------

    def check(self) -> None:
        check_ports_for_absent(self.lf, lab_containers(self.client, self.lf.project))

    def build(self, progress: Progress) -> NodeImage:
        built = ensure_image(self.lf, self.client, progress)
        return NodeImage(built.tag, built.tag)

    def to_start(self) -> bool:
        existing = lab_containers(self.client, self.lf.project)
        return any(c.status != "running" for c in existing.values()) or len(existing) < len(self.lf.lab.nodes)

    def write(self, image: str) -> None:
        self.lf.write_compose(image)

    def start(self, progress: Progress, on_running: OnRunning) -> list[str]:
        """Each node, as soon as it runs, is handed on (copied into, waited on) while the others still start."""
        doc = yaml.safe_load(self.lf.compose_path.read_text())
        targets = self.ssh_targets()
        count = len(self.lf.lab.nodes)
        progress.step(f"starting {count} node{'' if count == 1 else 's'}")
        running = compose_up.start(
            self.client, doc, self.lf.root, self.lf.project, self.lf.compose_path,
            lambda name, container: on_running(name, RunningNode(docker_target(self.client, container),
                                                                 targets[name], container)))
        return list(running)

    def down(self) -> tuple[int, int]:
        return down(self.lf.project, self.client)

    def status(self, checked: bool = False) -> dict[str, NodeState]:
        return status(self.lf, self.client, checked)

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
