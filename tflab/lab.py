"""Lab life cycle on the engine: build, up, status, down."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from tflab import hostsettings, image, nodes, ports, proc
from tflab.engine import Compose
from tflab.errors import EngineError, UserError
from tflab.image import BuildResult, Progress
from tflab.labfiles import LabFiles

STATE_FILE = ".tflab-state.json"
READY_TIMEOUT_S = 120.0


def ensure_image(
    lf: LabFiles, client: docker.DockerClient, progress: Progress, force: bool = False,
) -> BuildResult:
    """The lab's node image, built (with the local base first, when that is missing) if needed."""
    base = lf.config.base_image
    if lf.config.uses_local_base and not image.image_exists(client, base):
        progress(f"the local base {base} is missing: building it (debootstrap + pip)")
        image.build_base(
            client,
            hostsettings.parse_apt_sources(hostsettings.read_apt_sources()),
            hostsettings.pip_settings(proc.run, os.environ),
            progress,
            gpu=base == image.base_tag(True),
        )
    elif not image.image_exists(client, base):
        image.pull(client, base, progress)
    base_id = client.images.get(base).id
    return image.build_node(client, lf.image_context(), lf.image_tag(base_id), progress, force=force)


def connect_host(bind: str) -> str:
    """Where the host reaches a published port (the wildcard binds are reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind, bind)


def _load_state(lf: LabFiles) -> dict:
    path = lf.root / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _save_state(lf: LabFiles, state: dict) -> None:
    (lf.root / STATE_FILE).write_text(json.dumps(state, indent=1))


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


def copy_changed(
    lf: LabFiles, client: docker.DockerClient, containers: dict, progress: Progress,
) -> list[str]:
    """Copy code and data into every node whose copy is stale; what was copied, as `kind→node`."""
    state = _load_state(lf)
    copied: list[str] = []
    for sync in syncs(lf):
        stamp = nodes.fingerprint(sync.source, exclude=lf.root)
        stale = [
            name for name, c in containers.items()
            if state.get(c.id, {}).get(sync.kind) != stamp
        ]
        if not stale:
            continue
        progress(f"copying {sync.kind} ({sync.source}) into {len(stale)} node(s)")
        archive = nodes.pack(sync.source, exclude=lf.root)
        try:
            with ThreadPoolExecutor(max_workers=min(8, len(stale))) as pool:
                list(pool.map(
                    lambda name: nodes.copy_into(client, containers[name], archive, sync.target),
                    stale,
                ))
        finally:
            archive.unlink(missing_ok=True)
        for name in stale:
            state.setdefault(containers[name].id, {})[sync.kind] = stamp
            copied.append(f"{sync.kind}→{name}")
    live = {c.id for c in containers.values()}
    _save_state(lf, {cid: v for cid, v in state.items() if cid in live})
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


def up(lf: LabFiles, client: docker.DockerClient, compose: Compose, progress: Progress) -> list[str]:
    """Bring the lab up (idempotent): image, nodes, SSH ready, code and data copied."""
    built = ensure_image(lf, client, progress)
    lf.write_compose(built.tag)
    lf.runs_dir.mkdir(parents=True, exist_ok=True)
    check_ports_for_absent(lf, nodes.lab_containers(client, lf.project))
    progress(f"starting {len(lf.lab.nodes)} nodes")
    compose("up", "-d", "--remove-orphans", "--quiet-pull")
    wait_ready(lf, client, progress)
    containers = nodes.lab_containers(client, lf.project)
    return copy_changed(lf, client, containers, progress)


def wait_ready(lf: LabFiles, client: docker.DockerClient, progress: Progress) -> None:
    """Wait until every node's sshd answers on its published port (no fixed sleeps)."""
    host = connect_host(lf.lab.topology.bind)
    deadline = time.monotonic() + READY_TIMEOUT_S
    for node in lf.lab.nodes:
        progress(f"waiting for {node.name}'s sshd on {host}:{node.ssh_port}")
        if not nodes.wait_for_ssh(host, node.ssh_port, deadline):
            container = nodes.lab_containers(client, lf.project).get(node.name)
            tail = ""
            if container is not None:
                logs = container.logs(tail=3).decode(errors="replace").strip()
                tail = f"; its last output: {logs.splitlines()[-1]}" if logs else ""
            raise EngineError(
                f"{node.name} did not answer SSH on {host}:{node.ssh_port} within "
                f"{READY_TIMEOUT_S:.0f}s{tail}; see `tflab logs {node.name}`"
            )
    # The engine's healthcheck (the same TCP check, every 3 s) catches up a moment later;
    # waiting for it would only add its interval to every `up`.


def status(lf: LabFiles, client: docker.DockerClient) -> dict[str, tuple[str, str]]:
    """(state, health) of every node the engine has, by node name."""
    return {name: nodes.state_of(c) for name, c in nodes.lab_containers(client, lf.project).items()}


def down(project: str, client: docker.DockerClient) -> tuple[int, int]:
    """Remove every container and network labelled with the lab's project; (containers, networks)."""
    containers = client.containers.list(all=True, filters={"label": f"tflab.lab={project}"})
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda c: c.remove(force=True, v=True), containers))
    networks = client.networks.list(filters={"label": f"tflab.lab={project}"})
    for network in networks:
        try:
            network.remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot remove network {network.name}: {exc.explanation or exc}") from exc
    return len(containers), len(networks)
