"""Lab life cycle on one engine: build, up, status, down (the nodes as the lab's compose file says)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import docker
import docker.errors
import yaml

from tflab import base_image, containers, hostsettings, links, node_image, nodes, ports, proc, render
from tflab.builds import BuildResult, Progress, image_exists
from tflab.copying import Copier, docker_target
from tflab.errors import EngineError, UserError
from tflab.executor import DockerExecutor, Executor, SshExecutor
from tflab.launcher import warm_up
from tflab.labfiles import LabFiles
from tflab.threads import parallel

READY_TIMEOUT_S = 120.0


def ensure_image(lf: LabFiles, client: docker.DockerClient, progress: Progress, force: bool = False) -> BuildResult:
    """The lab's node image, built (with the local base first, when that is missing) if needed."""
    base = node_image.resolve_base(lf.config.base_image, lf.config.has_gpus, client)
    if node_image.is_local_base(base) and not image_exists(client, base):
        progress.step(f"the local base {base} is missing: building it once (mmdebstrap or debootstrap, then pip)")
        base_image.build_base(
            client,
            hostsettings.parse_apt_sources(hostsettings.read_apt_sources()),
            hostsettings.pip_settings(proc.run, os.environ),
            progress,
            gpu=lf.config.has_gpus,
        )
    elif not image_exists(client, base):
        node_image.pull(client, base, progress)
    base_image_ = client.images.get(base)
    context = lf.image_context()
    tag = lf.image_tag(base_image_.id)
    if node_image.is_local_base(base) and carries_node_files(base_image_, context, lf):
        # tflab's own base carries the node's files already: it is the node image, as it is.
        if force or not image_exists(client, tag):
            base_image_.tag(*tag.rsplit(":", 1))
            return BuildResult(tag, base_image_.id, built=True)
        return BuildResult(tag, base_image_.id, built=False)
    return node_image.build_node(client, context, tag, base, progress, force=force,
                                 proxies=hostsettings.proxy_build_args(os.environ))


def carries_node_files(base, context: dict[str, bytes], lf: LabFiles) -> bool:
    """Whether `base` holds exactly the lab's node files, and the lab's Dockerfile is tflab's own (unedited)."""
    files = {name: content for name, content in context.items() if name != "Dockerfile"}
    stock = render.dockerfile(lf.config).encode()
    return (context.get("Dockerfile") == stock
            and base.labels.get(base_image.NODE_FILES_LABEL) == base_image.node_files_hash(files))


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


def check_links(lf: LabFiles, client: docker.DockerClient, image: str) -> None:
    """A lab with shaped links needs the kernel's qdiscs: try the node's own shaping in a throwaway container."""
    if not lf.config.links:
        return
    error = nodes.probe_links(client, image, links.environment(lf.config.links), lf.project)
    if error is not None:
        qdisc = "netem" if "netem" in error else "tbf"
        raise UserError(links.missing_qdisc_advice(qdisc, error))


def up(lf: LabFiles, client: docker.DockerClient, progress: Progress) -> list[str]:
    """Bring the lab up (idempotent): image, nodes, SSH ready, code and data copied, standbys made.

    Each node, as soon as it runs, gets its copy and is waited on, while the others still start.
    """
    built = ensure_image(lf, client, progress)
    lf.write_compose(built.tag)
    lf.runs_dir.mkdir(parents=True, exist_ok=True)
    existing = nodes.lab_containers(client, lf.project)
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
        if not nodes.wait_for_ssh(host, ports_of[name], deadline):
            raise not_ready(name, (host, ports_of[name]), container)

    progress.step(f"starting {len(lf.lab.nodes)} nodes")
    try:
        running = containers.start(client, doc, lf.root, lf.project, lf.compose_path, on_running)
    finally:
        copied = copier.finish()
    if lf.config.warm:
        # Once every node runs: their imports would only slow the others' start.
        warm_up(DockerExecutor(client, running), list(running))
    return copied


def not_ready(name: str, target: tuple[str, int], container) -> EngineError:
    """The error of a node whose sshd never answered, with the last thing it said."""
    tail = ""
    if container is not None:
        logs = container.logs(tail=3).decode(errors="replace").strip()
        tail = f"; its last output: {logs.splitlines()[-1]}" if logs else ""
    return EngineError(f"{name} did not answer SSH on {target[0]}:{target[1]} within {READY_TIMEOUT_S:.0f}s{tail}; "
                       f"see `tflab logs {name}`")


def wait_ready(targets: dict[str, tuple[str, int]], containers: dict, progress: Progress) -> None:
    """Wait until every node's sshd answers on its published port, all nodes at once."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    progress.step(f"waiting for {len(targets)} sshd(s)")
    names = list(targets)
    ready = dict(zip(names, parallel(lambda name: nodes.wait_for_ssh(*targets[name], deadline), names, name="ssh")))
    for name, ok in ready.items():
        if not ok:
            raise not_ready(name, targets[name], containers.get(name))


def status(lf: LabFiles, client: docker.DockerClient) -> dict[str, tuple[str, str]]:
    """(state, health) of every node the engine has, by node name."""
    return {name: nodes.state_of(c) for name, c in nodes.lab_containers(client, lf.project).items()}


def down(project: str, client: docker.DockerClient) -> tuple[int, int]:
    """Remove every container and network labelled with the lab's project; (containers, networks)."""
    label = {"label": f"tflab.lab={project}"}
    try:
        containers = client.containers.list(all=True, filters=label)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda c: _remove(c), containers))
        networks = client.networks.list(filters=label)
        for network in networks:
            try:
                network.remove()
            except docker.errors.APIError as exc:
                if "not found" not in str(exc.explanation or exc).lower():
                    raise  # gone meanwhile is fine (a swarm removes its own)
    except docker.errors.APIError as exc:
        raise EngineError(f"removing the lab {project} failed: {exc.explanation or exc}; "
                          "run `tflab down` again, or `docker rm -f` what `tflab status` lists") from exc
    return len(containers), len(networks)


def _remove(container) -> None:
    try:
        container.remove(force=True, v=True)
    except docker.errors.APIError as exc:
        if "no such container" not in str(exc.explanation or exc).lower() and not isinstance(exc, docker.errors.NotFound):
            raise


class ComposeLab:
    """A lab on this host's engine, as its compose file describes it: what every command needs of it."""

    def __init__(self, lf: LabFiles, client: docker.DockerClient) -> None:
        self.lf = lf
        self.client = client

    def up(self, progress: Progress) -> list[str]:
        return up(self.lf, self.client, progress)

    def down(self) -> tuple[int, int]:
        return down(self.lf.project, self.client)

    def status(self) -> dict[str, tuple[str, str]]:
        return status(self.lf, self.client)

    def require_running(self, names: list[str]) -> dict:
        """The running containers of `names`, or a UserError naming the first that is not."""
        found = nodes.lab_containers(self.client, self.lf.project)
        for name in names:
            container = found.get(name)
            if container is None:
                raise UserError(f"node {name} is not up; run `tflab up` first")
            if container.status != "running":
                raise UserError(f"node {name} is {container.status}, not running; `tflab up` starts it again")
        return {name: found[name] for name in names}

    def ssh_targets(self) -> dict[str, tuple[str, int]]:
        """Where each node's SSH is published (host, port)."""
        host = connect_host(self.lf.lab.topology.bind)
        return {n.name: (host, n.ssh_port) for n in self.lf.lab.nodes}

    def executor(self, names: list[str], via: str = "docker") -> Executor:
        """How to reach these nodes (all must be running)."""
        containers = self.require_running(names)
        if via == "ssh":
            targets = self.ssh_targets()
            return SshExecutor({name: targets[name] for name in names}, str(self.lf.private_key))
        return DockerExecutor(self.client, containers)

    def logs(self, node: str | None, follow: bool, tail: str) -> int:
        """Print the nodes' logs, each line after its node's name (as compose does); 0."""
        found = nodes.lab_containers(self.client, self.lf.project)
        names = [node] if node else [n for n in self.lf.lab.names if n in found]
        if not names or any(name not in found for name in names):
            raise UserError(f"node {names[0] if names else 'of the lab'} is not up; run `tflab up` first")
        nodes.print_logs({name: found[name] for name in names}, follow, tail)
        return 0
