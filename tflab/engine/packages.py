"""A lab's own packages, installed into its node image on top of the base, as one layer.

The install runs in a throwaway container of the image built so far, with the host's build
settings (pip.conf with the index and CA bundle, the proxies) mounted read-only, as the local
base's install does: the image keeps none of them (not in `docker history`, its config or a
layer). The container is committed as the node image only when apt and pip succeeded; a package
that does not exist fails the build with pip's (or apt's) own line, and tags nothing.
"""

from __future__ import annotations

import json

import docker
import docker.errors

from tflab.engine.builds import BuildResult, Progress, follow, new_log, settings_mount
from tflab.engine.node_image import tar_context
from tflab.errors import EngineError
from tflab.host.buildsettings import BUILD_MOUNT, PipSettings
from tflab.plan.config import Packages

SHARE = "/usr/local/share/tflab"  # where the node image keeps its build context (the requirements too)
INSTALL = (
    'set -e; settings=$1; apt=$2; shift 2; '
    'set -a; . "$settings/proxy.env"; set +a; '
    'export PIP_CONFIG_FILE="$settings/pip.conf"; '
    'if [ -n "$apt" ]; then '
    '  export DEBIAN_FRONTEND=noninteractive; '
    '  apt-get update -q; '
    '  apt-get install -y -q --no-install-recommends $apt; '  # noqa: word splitting on purpose
    '  rm -rf /var/lib/apt/lists/*; '
    'fi; '
    f'cd {SHARE}/requirements 2>/dev/null || cd /; '
    'if [ $# -gt 0 ]; then '
    '  python3 -m pip install --no-cache-dir --progress-bar off --disable-pip-version-check "$@"; '
    'fi'
)


def install_argv(packages: Packages) -> list[str]:
    """The install's command: apt names, then pip's arguments (`-r FILE` read from the image's copy)."""
    pip: list[str] = []
    for spec in packages.pip:
        pip += ["-r", spec[3:]] if spec.startswith("-r ") else [spec]
    return ["sh", "-c", INSTALL, "tflab-packages", BUILD_MOUNT, " ".join(packages.apt), *pip]


def failure_line(output: str) -> str:
    """The line of pip's or apt's output that names what failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("ERROR: ", "E: ", "error: "):
        found = [line for line in lines if line.startswith(marker)]
        if found:
            return found[0]
    return lines[-1] if lines else "no output"


def install(client: docker.DockerClient, stage: str, tag: str, packages: Packages, pip: PipSettings,
            entrypoint: list[str], progress: Progress, files: dict[str, bytes] | None = None) -> BuildResult:
    """`packages` installed on the image `stage`, committed as `tag` (nothing is tagged when they fail); `files`
    (the ones naming the packages: the record `status` reads, the requirements files) are put in SHARE first,
    where a stage built from the lab's Dockerfile holds them already."""
    progress.step("installing the lab's packages: " + ", ".join([*packages.apt, *packages.pip]))
    log_path = new_log("packages")
    with settings_mount(pip) as settings:
        try:
            container = client.containers.create(stage, install_argv(packages), entrypoint=[], user="root",
                                                 mounts=[settings], labels={"tflab.build": "packages"})
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot start the packages' install: {exc.explanation or exc}") from exc
        try:
            if files:
                try:
                    container.put_archive(SHARE, tar_context(files))
                except docker.errors.APIError as exc:
                    raise EngineError(f"cannot give the packages' install its files: {exc.explanation or exc}") from exc
            if follow(container, log_path, progress) != 0:
                said = failure_line(log_path.read_text(errors="replace"))
                advice = " (pass the CA bundle your network needs: `tflab base --ca-bundle`)" \
                    if "certificate" in said.lower() else ""
                raise EngineError(f"installing the lab's packages failed: {said}{advice}; nothing was tagged, "
                                  f"the lab's previous image (if any) is unchanged; log: {log_path}")
            repository, version = tag.rsplit(":", 1)
            # The commit keeps the container's command in the image's history: only names and paths are in it.
            image = container.commit(repository=repository, tag=version, changes=[
                # the install container's own label is not the image's (its nodes would carry it)
                f"ENTRYPOINT {json.dumps(entrypoint)}", "CMD []", "LABEL tflab.image=node tflab.build=",
            ])
        finally:
            container.remove(force=True)
    return BuildResult(tag, image.id, built=True, log=log_path)


__all__ = ["failure_line", "install", "install_argv"]
