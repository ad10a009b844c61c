"""Lab life cycle on one engine (compose): build, up, status, down."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import docker
import docker.errors

from tflab import base_image, hostsettings, links, node_image, nodes, ports, proc
from tflab.builds import BuildResult, Progress, image_exists
from tflab.engine import Compose, find_compose
from tflab.errors import EngineError, UserError
from tflab.executor import DockerExecutor, Executor, SshExecutor
from tflab.labfiles import LabFiles
from tflab.threads import parallel

STATE_FILE = ".tflab-state.json"
READY_TIMEOUT_S = 120.0


def ensure_image(lf: LabFiles, client: docker.DockerClient, progress: Progress, force: bool = False) -> BuildResult:
    """The lab's node image, built (with the local base first, when that is missing) if needed."""
    base = node_image.resolve_base(lf.config.base_image, lf.config.has_gpus, client)
    if node_image.is_local_base(base) and not image_exists(client, base):
        progress.step(f"the local base {base} is missing: building it once (debootstrap + pip)")
        base_image.build_base(
            client,
            hostsettings.parse_apt_sources(hostsettings.read_apt_sources()),
            hostsettings.pip_settings(proc.run, os.environ),
            progress,
            gpu=lf.config.has_gpus,
        )
    elif not image_exists(client, base):
        node_image.pull(client, base, progress)
    base_id = client.images.get(base).id
    return node_image.build_node(client, lf.image_context(), lf.image_tag(base_id), base, progress, force=force)


def connect_host(bind: str) -> str:
    """Where the host reaches a published port (the wildcard binds are reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


def _load_state(lf: LabFiles) -> dict:
    try:
        state = json.loads((lf.root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(lf: LabFiles, state: dict) -> None:
    (lf.root / STATE_FILE).write_text(json.dumps(state))


@dataclass(frozen=True)
class Sync:
    """A host folder and where it lands in every node."""

    kind: str  # code | data
    source: Path
    target: str


def syncs(lf: LabFiles) -> list[Sync]:
    """What `up` copies: the code always, the data unless it is mounted."""
    out = []
    if lf.config.code:
        out.append(Sync("code", lf.resolve(lf.config.code), "/workspace"))
    if lf.config.data and lf.config.data_mode == "copy":
        out.append(Sync("data", lf.resolve(lf.config.data), "/data"))
    for sync in out:
        if not sync.source.is_dir():
            raise UserError(f"the lab's {sync.kind} folder {sync.source} does not exist")
    return out


@dataclass(frozen=True)
class CopyTarget:
    """Where `up` copies a node's files: the id its copy is remembered by, and how to put an archive there."""

    ident: str
    put: Callable[[Path, str, tuple[str, ...]], None]  # (archive, target folder, files to remove)


def docker_targets(client: docker.DockerClient, containers: dict) -> dict[str, CopyTarget]:
    """Copy targets for containers of this host's engine."""
    return {name: CopyTarget(c.id, partial(nodes.copy_into, client, c)) for name, c in containers.items()}


def copy_changed(lf: LabFiles, targets: dict[str, CopyTarget], progress: Progress) -> list[str]:
    """Copy into every node the files of code and data that changed since its last copy.

    Each node's copy is remembered by file (size and mtime); only new and changed files
    travel (one tar stream per node, all nodes at once) and files gone from the host are
    removed. Nothing is cleared first. What was copied, as `kind→node`.
    """
    state = _load_state(lf)
    copied: list[str] = []
    for sync in syncs(lf):
        manifest = nodes.manifest(sync.source, exclude=lf.root)
        work: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for name, target in targets.items():
            old = state.get(target.ident, {}).get(sync.kind)
            old = old if isinstance(old, dict) else {}
            if old == manifest:
                continue
            changed = tuple(p for p, stamp in manifest.items() if old.get(p) != stamp)
            removed = tuple(p for p in old if p not in manifest)
            work.setdefault((changed, removed), []).append(name)
        if not work:
            continue
        count = sum(len(names) for names in work.values())
        progress.step(f"copying {sync.kind} ({sync.source}) into {count} node(s)")
        for (changed, removed), names in work.items():
            archive = nodes.pack(sync.source, list(changed))
            try:
                parallel(lambda name: targets[name].put(archive, sync.target, removed), names, name="copy")
            finally:
                archive.unlink(missing_ok=True)
            for name in names:
                state.setdefault(targets[name].ident, {})[sync.kind] = manifest
                copied.append(f"{sync.kind}→{name}")
    live = {t.ident for t in targets.values()}
    _save_state(lf, {ident: v for ident, v in state.items() if ident in live})
    return copied


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


def up(lf: LabFiles, client: docker.DockerClient, compose: Compose, progress: Progress) -> list[str]:
    """Bring the lab up (idempotent): image, nodes, SSH ready, code and data copied."""
    built = ensure_image(lf, client, progress)
    lf.write_compose(built.tag)
    lf.runs_dir.mkdir(parents=True, exist_ok=True)
    existing = nodes.lab_containers(client, lf.project)
    check_ports_for_absent(lf, existing)
    if any(c.status != "running" for c in existing.values()) or len(existing) < len(lf.lab.nodes):
        check_links(lf, client, built.tag)
    progress.step(f"starting {len(lf.lab.nodes)} nodes")
    compose("up", "-d", "--remove-orphans", "--quiet-pull")
    containers = nodes.lab_containers(client, lf.project)
    host = connect_host(lf.lab.topology.bind)
    wait_ready({n.name: (host, n.ssh_port) for n in lf.lab.nodes}, containers, progress)
    return copy_changed(lf, docker_targets(client, containers), progress)


def wait_ready(targets: dict[str, tuple[str, int]], containers: dict, progress: Progress) -> None:
    """Wait until every node's sshd answers on its published port, all nodes at once."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    progress.step(f"waiting for {len(targets)} sshd(s)")
    names = list(targets)
    ready = dict(zip(names, parallel(lambda name: nodes.wait_for_ssh(*targets[name], deadline), names, name="ssh")))
    late = [name for name, ok in ready.items() if not ok]
    if late:
        name = late[0]
        host, port = targets[name]
        container = containers.get(name)
        tail = ""
        if container is not None:
            logs = container.logs(tail=3).decode(errors="replace").strip()
            tail = f"; its last output: {logs.splitlines()[-1]}" if logs else ""
        raise EngineError(
            f"{name} did not answer SSH on {host}:{port} within {READY_TIMEOUT_S:.0f}s{tail}; "
            f"see `tflab logs {name}`"
        )


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
    """A lab on this host's engine, driven through compose: what every command needs of it."""

    def __init__(self, lf: LabFiles, client: docker.DockerClient, compose: Compose | None = None) -> None:
        self.lf = lf
        self.client = client
        self.compose = compose or Compose(lf.compose_path, lf.project)

    def up(self, progress: Progress) -> list[str]:
        return up(self.lf, self.client, self.compose, progress)

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
        """Show the nodes' logs (compose's own command); its exit code."""
        args = ["logs", "--tail", tail] + (["--follow"] if follow else []) + ([node] if node else [])
        return subprocess.call([*find_compose(), "-f", str(self.lf.compose_path), "-p", self.lf.project, *args])
