"""The stages of a lab's life both backends share: its node image, its links tried, its nodes ready, its removal.

A compose lab and a swarm lab differ in how their nodes are started; what comes before (the
image the nodes run, the kernel's shaping tried in a throwaway container) and after (every
node's sshd answering; every container and network of the lab removed) is one code, here.
"""

from __future__ import annotations

import os
import time

import docker
import docker.errors
from docker.models.containers import Container

from tflab.engine import local_base, node_image, packages
from tflab.engine.builds import BuildResult, Progress, image_exists
from tflab.engine.containers import labelled, probe_links
from tflab.errors import EngineError, UserError
from tflab.host import buildsettings, proc
from tflab.host.fanout import parallel
from tflab.host.labfiles import LabFiles
from tflab.host.ports import wait_for_ssh
from tflab.plan import config as cfg
from tflab.plan import links
from tflab.render import image_files

READY_TIMEOUT_S = 120.0


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
    target = f"tflab-node-stage:{tag.rsplit(':', 1)[1]}" if config.packages else tag
    if node_image.is_local_base(base) and carries_node_files(base_image_, context, lf):
        # tflab's own base carries the node's files already: it is the node image, as it is.
        base_image_.tag(*target.rsplit(":", 1))
        built = BuildResult(target, base_image_.id, built=True)
    else:
        built = node_image.build_node(client, context, target, base, progress, force=force,
                                      proxies=buildsettings.proxy_build_args(os.environ))
    if not config.packages:
        return built
    try:
        entrypoint = client.images.get(target).attrs.get("Config", {}).get("Entrypoint") or []
        return packages.install(client, target, tag, config.packages, buildsettings.pip_settings(proc.run, os.environ),
                                entrypoint, progress)
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


def wait_ready(targets: dict[str, tuple[str, int]], containers: dict, progress: Progress) -> None:
    """Wait until every node's sshd answers on its published port, all nodes at once."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    progress.step(f"waiting for {len(targets)} sshd(s)")
    names = list(targets)
    ready = dict(zip(names, parallel(lambda name: wait_for_ssh(*targets[name], deadline), names, name="ssh")))
    for name, ok in ready.items():
        if not ok:
            raise not_ready(name, targets[name], containers.get(name))


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
