"""A lab's own packages (and Keras 2), installed into its node image on top of the base, as one layer.

The install runs in a throwaway container of the image built so far, with the host's build
settings (pip.conf with the index and CA bundle, the proxies) mounted read-only, as the local
base's install does: the image keeps none of them (not in `docker history`, its config or a
layer). pip installs against the base's TensorFlow, never a second one beside it (the node's
one_tensorflow.py: constraints pinning it, and `tensorflow` recorded where the base has it
under another name); with Keras 2, the tf-keras release of that TensorFlow is installed too.
The container is committed as the node image only when apt and pip succeeded; a package that
does not exist fails the build with pip's (or apt's) own line, and tags nothing.
"""

from __future__ import annotations

import json
import re

import docker
import docker.errors

from tflab.engine.builds import BuildResult, Progress, follow, new_log, settings_mount
from tflab.engine.node_image import tar_context
from tflab.errors import EngineError
from tflab.host.buildsettings import BUILD_MOUNT, PipSettings
from tflab.plan.config import Packages

SHARE = "/usr/local/share/tflab"  # where the node image keeps its build context (the requirements too)
CONSTRAINTS = "/tmp/tflab-one-tensorflow.txt"  # removed before the commit
INSTALL = (
    'set -e; settings=$1; apt=$2; keras=$3; shift 3; '
    'set -a; . "$settings/proxy.env"; set +a; '
    'export PIP_CONFIG_FILE="$settings/pip.conf"; '
    'if [ -n "$apt" ]; then '
    '  export DEBIAN_FRONTEND=noninteractive; '
    '  apt-get update -q; '
    '  apt-get install -y -q --no-install-recommends $apt; '  # noqa: word splitting on purpose
    '  rm -rf /var/lib/apt/lists/*; '
    'fi; '
    f'extra=$(python3 {SHARE}/one_tensorflow.py {CONSTRAINTS} $keras); '  # noqa: word splitting on purpose
    f'export PIP_CONSTRAINT={CONSTRAINTS}; '
    f'cd {SHARE}/requirements 2>/dev/null || cd /; '
    'set -- "$@" $extra; '  # noqa: word splitting on purpose
    'if [ $# -gt 0 ]; then '
    '  python3 -m pip install --no-cache-dir --progress-bar off --disable-pip-version-check "$@"; '
    'fi; '
    f'rm -f {CONSTRAINTS}'
)


def install_argv(packages: Packages, keras: int | None = None) -> list[str]:
    """The install's command: apt names, Keras 2 or not, then pip's arguments (`-r FILE` read from the image's
    copy)."""
    pip: list[str] = []
    for spec in packages.pip:
        pip += ["-r", spec[3:]] if spec.startswith("-r ") else [spec]
    return ["sh", "-c", INSTALL, "tflab-packages", BUILD_MOUNT, " ".join(packages.apt),
            "--keras 2" if keras == 2 else "", *pip]


def described(packages: Packages, keras: int | None) -> str:
    """What the install puts in, as the progress line names it."""
    return ", ".join([*packages.apt, *packages.pip, *(["tf-keras (Keras 2)"] if keras == 2 else [])])


def failure_line(output: str) -> str:
    """The line of pip's or apt's output that names what failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("ERROR: ", "E: ", "error: ", "one_tensorflow: "):
        found = [line for line in lines if line.startswith(marker)]
        if found:
            return found[0]
    return lines[-1] if lines else "no output"


# pip's words where what a package requires would replace the base's TensorFlow, which the constraints keep.
CONFLICT = re.compile(r"(?:The conflict is caused by:|conflicting dependencies)", re.IGNORECASE)
TENSORFLOW_NEEDED = re.compile(r"^\s*(\S+) [\w.+!-]+ depends on (tensorflow[\w-]*)\b(.*)$", re.MULTILINE)
TENSORFLOW_ASKED = re.compile(r"^\s*The user requested (tensorflow(?:-cpu|-gpu)?\b[^\n(]*)$", re.MULTILINE)


def failure_advice(output: str) -> str:
    """Why a failed install failed where tflab can tell more than pip's line: a package that needs another
    TensorFlow than the base's (which stays, one per image), a missing CA bundle."""
    said = failure_line(output)
    needs = TENSORFLOW_NEEDED.search(output) if CONFLICT.search(output) else None
    if needs is not None:
        return (f"{said} ({needs.group(1)} wants {needs.group(2)}{needs.group(3).rstrip()}, and the image keeps its "
                "base's TensorFlow, one per image: pin that package to a release for it, or the lab's TensorFlow "
                "with --tensorflow)")
    asked = TENSORFLOW_ASKED.search(output) if CONFLICT.search(output) else None
    if asked is not None:
        return (f"{said} (the lab's packages ask for {asked.group(1).strip()}, and the image keeps its base's "
                "TensorFlow, one per image: pin the lab's TensorFlow with --tensorflow, or image.tensorflow in "
                "tflab.yaml, rather than among its packages)")
    if "certificate" in said.lower():
        return f"{said} (pass the CA bundle your network needs: `tflab base --ca-bundle`)"
    return said


def install(client: docker.DockerClient, stage: str, tag: str, packages: Packages, pip: PipSettings,
            entrypoint: list[str], progress: Progress, files: dict[str, bytes] | None = None,
            keras: int | None = None) -> BuildResult:
    """`packages` (and with `keras` 2, Keras 2) installed on the image `stage`, committed as `tag` (nothing is tagged
    when they fail); `files` (the ones naming the packages: the record `status` reads, the requirements files) are
    put in SHARE first, where a stage built from the lab's Dockerfile holds them already."""
    progress.step("installing the lab's packages: " + described(packages, keras))
    log_path = new_log("packages")
    with settings_mount(pip) as settings:
        try:
            # No proxy of the Docker client's configuration in its environment (the SDK's default): the commit would
            # keep it in the image's; they reach pip through the mount, with the host's.
            container = client.containers.create(stage, install_argv(packages, keras), entrypoint=[], user="root",
                                                 mounts=[settings], labels={"tflab.build": "packages"},
                                                 use_config_proxy=False)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot start the packages' install: {exc.explanation or exc}") from exc
        try:
            if files:
                try:
                    container.put_archive(SHARE, tar_context(files))
                except docker.errors.APIError as exc:
                    raise EngineError(f"cannot give the packages' install its files: {exc.explanation or exc}") from exc
            if follow(container, log_path, progress) != 0:
                said = failure_advice(log_path.read_text(errors="replace"))
                raise EngineError(f"installing the lab's packages failed: {said}; nothing was tagged, "
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


__all__ = ["failure_advice", "failure_line", "install", "install_argv"]
