"""A lab's bring-up as one pipeline of named stages both backends run, and what else of a lab's life they share.

`bring_up` is the order every backend follows: check what must hold, build the node image, try
the links' shaping in a throwaway container, write the engine's file, start the nodes (each one
copied into and waited on as soon as it runs). A backend (compose_lab,
swarm_lab) says how it does each stage (`Stages`); the image, the links, the copy and the SSH
wait are one code, here, as is a lab's removal.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import docker
import docker.errors
from docker.models.containers import Container

from tflab.engine import local_base, node_image, packages
from tflab.engine.builds import BuildResult, Progress, image_exists
from tflab.engine.containers import labelled, probe_links
from tflab.engine.copying import Copier, CopyTarget
from tflab.engine.executors import Executor
from tflab.errors import EngineError, UserError
from tflab.host import buildsettings, proc
from tflab.host.fanout import parallel
from tflab.host.labfiles import LabFiles
from tflab.host.ports import wait_for_ssh
from tflab.plan import config as cfg
from tflab.plan import links
from tflab.render import image_files

READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class NodeImage:
    """The node image: the name the nodes run it by (a registry's, for a swarm on several hosts), and its tag here."""

    deployed: str
    local: str


@dataclass(frozen=True)
class RunningNode:
    """A node that runs: where its code and data go, where its sshd answers, its container (where it is here)."""

    copy_to: CopyTarget
    ssh: tuple[str, int]
    container: Any = None
    copy_over_ssh: bool = False  # its copy goes through its sshd, which must answer first


OnRunning = Callable[[str, RunningNode], None]


class Stages(Protocol):
    """How one backend does each stage of `bring_up`."""

    def check(self) -> None:
        """What must hold before anything is built or started (ports free, a swarm manager, placements)."""

    def build(self, progress: Progress) -> NodeImage:
        """The node image, built (and pushed) where needed."""

    def to_start(self) -> bool:
        """Whether some node is not running yet (then the links' shaping is tried first)."""

    def write(self, image: str) -> None:
        """The engine's file for the lab (the compose file, the stack file), naming `image`."""

    def start(self, progress: Progress, on_running: OnRunning) -> list[str]:
        """Start the nodes, calling `on_running` for each as soon as it runs; the nodes that run."""

    def executor(self, names: list[str], via: str = "docker") -> Executor:
        """What runs commands in the nodes."""


def bring_up(lf: LabFiles, client: docker.DockerClient, stages: Stages, progress: Progress) -> list[str]:
    """Bring the lab up (idempotent), stage by stage; what was copied into which node, as `kind→node`."""
    if lf.config.target == "compose":
        check_gpu_runtime(lf, client.info())
    stages.check()
    image = stages.build(progress)
    if stages.to_start():
        check_links(lf, client, image.local)
    lf.runs_dir.mkdir(parents=True, exist_ok=True)
    stages.write(image.deployed)
    copier = Copier(lf, progress)
    deadline = time.monotonic() + READY_TIMEOUT_S

    def ready(name: str, node: RunningNode) -> None:
        """Copy into a node and wait for its sshd, as soon as it runs (while the others still start)."""
        if node.copy_over_ssh:
            answer(name, node)
        copier.copy(name, node.copy_to)
        answer(name, node)

    def answer(name: str, node: RunningNode) -> None:
        if not wait_for_ssh(*node.ssh, deadline):
            raise not_ready(name, node.ssh, node.container)

    try:
        running = stages.start(progress, ready)
    finally:
        copied = copier.finish()
    return copied


CDI_SPECS = ("/etc/cdi", "/var/run/cdi")  # where the NVIDIA Container Toolkit writes its CDI specs
GPU_HOOK = "nvidia-container-runtime-hook"  # what the engine runs for a container's `--gpus` (the toolkit's)


def check_gpu_runtime(lf: LabFiles, info: dict[str, Any]) -> None:
    """Before anything is built: a lab whose nodes own GPUs needs the engine to hand GPUs to containers (the NVIDIA
    Container Toolkit: its runtime, its hook, or its CDI specs); a one-line error naming the choices otherwise."""
    owners = [f"{n.name}: {','.join(map(str, n.gpus))}" for n in lf.lab.nodes if n.gpus]
    if not owners:
        return
    if "nvidia" in (info.get("Runtimes") or {}) or shutil.which(GPU_HOOK):
        return
    if any(os.path.isdir(folder) and any(name.startswith("nvidia") for name in os.listdir(folder))
           for folder in CDI_SPECS):
        return
    runtimes = ", ".join(sorted(info.get("Runtimes") or {})) or "none"
    raise UserError(f"this lab's nodes own GPUs ({'; '.join(owners)}), and this engine cannot give a container a GPU "
                    f"(its runtimes: {runtimes}; no {GPU_HOOK}, no NVIDIA CDI spec): install the NVIDIA Container "
                    "Toolkit (`nvidia-ctk runtime configure --runtime=docker`), or make it a CPU lab: `tflab set "
                    "--gpus-per-node 0`; nothing was built or started")


def ensure_image(lf: LabFiles, client: docker.DockerClient, progress: Progress, force: bool = False) -> BuildResult:
    """The lab's node image, built (with the local base first, when that is missing) if needed.

    Its base, then tflab's node files (a Dockerfile build, unless tflab's own base carries them),
    then the lab's own packages (one layer, installed with the host's build settings mounted).
    """
    config = lf.config
    base = node_image.resolve_base(config.base_image, config.has_gpus, client, config.tensorflow)
    if node_image.is_local_base(base) and not image_exists(client, base):
        mirror = buildsettings.parse_apt_sources(buildsettings.read_apt_sources())
        if config.tensorflow:
            check_release(config.tensorflow, config.has_gpus, mirror.python, mirror.suite)
        progress.step(f"the local base {base} is missing: building it once (mmdebstrap or debootstrap, then pip)")
        local_base.build_base(
            client, mirror, buildsettings.pip_settings(proc.run, os.environ), progress, gpu=config.has_gpus,
            tensorflow=cfg.tensorflow_requirement(config.has_gpus, config.tensorflow) if config.tensorflow else None,
            tag=base,
        )
    elif not image_exists(client, base):
        node_image.pull(client, base, progress)
    base_image_ = client.images.get(base)
    lf.refresh_guard()  # a lab made by another tflab gets this one's guard in image/ too
    context = lf.image_context()
    tag = lf.image_tag(base_image_.id)
    if not force and image_exists(client, tag):
        return BuildResult(tag, client.images.get(tag).id, built=False)
    buildsettings.check_keras_2(config.tensorflow, config.keras, proc.run)
    target = f"tflab-node-stage:{tag.rsplit(':', 1)[1]}" if config.installs else tag
    named = {name: content for name, content in context.items() if image_files.is_packages_file(name)}
    node_context = {name: content for name, content in context.items() if name not in named}
    carried = {}  # the files naming the packages, where the packages' install puts them (no Dockerfile build did)
    if (node_image.is_local_base(base) and carries_node_files(base_image_, node_context, lf)
            and (config.installs or not named)):
        # tflab's own base carries the node's files already: it is the node image as it is, or the stage its
        # packages are installed on (a Dockerfile build would only copy the same files again: 30 s here).
        base_image_.tag(*target.rsplit(":", 1))
        built = BuildResult(target, base_image_.id, built=True)
        carried = named
    else:
        built = node_image.build_node(client, context, target, base, progress, force=force,
                                      proxies=buildsettings.proxy_build_args(os.environ))
    if not config.installs:
        return built
    try:
        entrypoint = client.images.get(target).attrs.get("Config", {}).get("Entrypoint") or []
        return packages.install(client, target, tag, config.packages, buildsettings.pip_settings(proc.run, os.environ),
                                entrypoint, progress, files=carried, keras=config.keras)
    finally:
        try:
            client.images.remove(target)  # the packages' image keeps its layers; this name goes
        except docker.errors.APIError:
            pass


def check_release(version: str, has_gpus: bool, python: tuple[int, int] | None, suite: str) -> None:
    """Before anything is built: a pinned TensorFlow that the base's Python can install, by the index's own list."""
    where = f" (tflab's own base: {suite}, Python {python[0]}.{python[1]})" if python else f" ({suite})"
    cfg.check_tensorflow(version, python, where)
    if python is None:
        return
    package = "tensorflow-cpu" if not has_gpus else "tensorflow"
    available = buildsettings.index_versions(proc.run, package, python)
    if available is None:
        return  # the index cannot be asked from here: pip says it at the build, if it must
    if cfg.pick_release(version, available) is None:
        fits = ", ".join(available[:8]) + (", ..." if len(available) > 8 else "")
        raise UserError(f"TensorFlow {version} cannot be installed{where}: the index has {package} {fits} "
                        "for that Python; pin one of them")


def carries_node_files(base, context: dict[str, bytes], lf: LabFiles) -> bool:
    """Whether `base` holds exactly the lab's node files, and the lab's Dockerfile is tflab's own (unedited)."""
    files = {name: content for name, content in context.items() if name != "Dockerfile"}
    stock = image_files.dockerfile(lf.config).encode()
    return (context.get("Dockerfile") == stock
            and base.labels.get(local_base.NODE_FILES_LABEL) == image_files.files_hash(files))


def check_links(lf: LabFiles, client: docker.DockerClient, image: str) -> None:
    """A lab with shaped links needs the kernel's qdiscs: try the node's own shaping in a throwaway container."""
    if not lf.config.links:
        return
    error = probe_links(client, image, links.environment(lf.config.links), lf.project)
    if error is not None:
        qdisc = "netem" if "netem" in error else "tbf"
        raise UserError(links.missing_qdisc_advice(qdisc, error))


def not_ready(name: str, target: tuple[str, int], container) -> EngineError:
    """The error of a node whose sshd never answered, with the last thing it said."""
    tail = ""
    if container is not None:
        logs = container.logs(tail=3).decode(errors="replace").strip()
        tail = f"; its last output: {logs.splitlines()[-1]}" if logs else ""
    return EngineError(f"{name} did not answer SSH on {target[0]}:{target[1]} within {READY_TIMEOUT_S:.0f}s{tail}; "
                       f"see `tflab logs {name}`")


def down(project: str, client: docker.DockerClient) -> tuple[int, int]:
    """Remove every container and network labelled with the lab's project; (containers, networks)."""
    label = {"label": f"tflab.lab={project}"}
    try:
        containers = labelled(client, label["label"])
        parallel(_remove, containers, name="remove")
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


def interactive_exec(container: Container, argv: list[str]) -> list[str]:
    """`docker exec -it` of `argv` in a container, from /workspace."""
    return ["docker", "exec", "-it", "-w", "/workspace", container.id, *argv]
