"""The local base image, for hosts with no container registry: debootstrap, docker import, pip.

Built from the distribution's own packages (the host's apt mirror) and pip (the host's
index, proxies and CA bundle). Those settings reach the build as files in a read-only bind
mount (hostsettings.build_files): nothing of them is on a command line or in an
environment that a committed image would keep.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
import docker.errors
import docker.types

from tflab import config as cfg
from tflab import hostsettings
from tflab.builds import BuildResult, Progress, image_exists, new_log, run_logged
from tflab.errors import EngineError, UserError
from tflab.hostsettings import BUILD_MOUNT, AptMirror, PipSettings

BASE_PACKAGES = (
    "python3", "python3-venv", "openssh-server", "openssh-client", "ca-certificates",
    "procps", "iproute2", "bash", "util-linux", "passwd",
)
EXTRA_PIP = ("tensorboard",)  # TensorFlow 2.20+ no longer brings it; `tflab tensorboard` needs it
VENV = "/opt/tensorflow"
RAW_REPOSITORY = "tflab-base-raw"


def base_tag(gpu: bool) -> str:
    """The local base's tag (the CPU or GPU build of TensorFlow)."""
    return cfg.LOCAL_GPU_BASE if gpu else cfg.LOCAL_BASE


def base_recipe(mirror: AptMirror, package: str) -> str:
    """A short hash of what the local base is made from (a changed recipe rebuilds it)."""
    text = "\n".join([mirror.uri, mirror.suite, *BASE_PACKAGES, package, *EXTRA_PIP, VENV])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def raw_recipe(mirror: AptMirror) -> str:
    """A short hash of the debootstrapped root file system alone."""
    return hashlib.sha256("\n".join([mirror.uri, mirror.suite, *BASE_PACKAGES]).encode()).hexdigest()[:12]


def build_base(
    client: docker.DockerClient, mirror: AptMirror, pip: PipSettings, progress: Progress,
    gpu: bool = False, force: bool = False, tensorflow: str | None = None, tag: str | None = None,
) -> BuildResult:
    """The local base: a debootstrapped system (kept, so a rebuild skips it) and TensorFlow by pip."""
    tag = tag or base_tag(gpu)
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag += ":latest"
    package = tensorflow or ("tensorflow[and-cuda]" if gpu else "tensorflow-cpu")
    recipe = base_recipe(mirror, package)
    if not force and image_exists(client, tag):
        existing = client.images.get(tag)
        if existing.labels.get("tflab.recipe") == recipe:
            return BuildResult(tag, existing.id, built=False)
        progress.step(f"{tag} was built from another recipe: building it again")
    log_path = new_log("base")
    raw = f"{RAW_REPOSITORY}:{raw_recipe(mirror)}"
    if not image_exists(client, raw):
        _debootstrap(client, mirror, raw, progress, log_path)
    return _install_tensorflow(client, raw, tag, package, recipe, pip, progress, log_path)


def _debootstrap(client: docker.DockerClient, mirror: AptMirror, raw: str, progress: Progress,
                 log_path: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise UserError("debootstrap is not installed; run `apt-get install debootstrap` (as root)")
    if os.geteuid() != 0:
        raise UserError("building the local base needs root (debootstrap); run `sudo tflab base`")
    with log_path.open("a") as log, tempfile.TemporaryDirectory(prefix="tflab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        progress.step(f"debootstrap {mirror.suite} from {mirror.uri}")
        argv = [
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            mirror.suite, str(rootfs), mirror.uri,
        ]
        if run_logged(argv, log, progress) != 0:
            raise EngineError(
                f"debootstrap of {mirror.suite} from {mirror.uri} failed; is the mirror reachable? "
                f"log: {log_path}"
            )
        for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()  # every node makes its own host keys when it starts
        progress.step("importing the root file system into the engine")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            repository, version = raw.split(":")
            client.api.import_image(src=tar.stdout, repository=repository, tag=version)
        finally:
            tar.wait()


def install_script(package: str) -> str:
    """The build's shell script: proxies from the mounted file, pip configured by the mounted pip.conf."""
    return (
        f"set -e; set -a; . {BUILD_MOUNT}/proxy.env; set +a; "
        f"python3 -m venv {VENV}; "
        f"{VENV}/bin/pip install --no-cache-dir --progress-bar off --disable-pip-version-check "
        f"'{package}' {' '.join(EXTRA_PIP)}; "
        f"{VENV}/bin/python -c 'import tensorflow as tf; print(\"TensorFlow\", tf.__version__)'"
    )


def _install_tensorflow(
    client: docker.DockerClient, raw: str, tag: str, package: str, recipe: str, pip: PipSettings,
    progress: Progress, log_path: Path,
) -> BuildResult:
    """pip install TensorFlow into a venv on the raw base, then commit it as `tag`."""
    progress.step(f"pip install {package}")
    with tempfile.TemporaryDirectory(prefix="tflab-build-") as settings_dir:
        for name, content in hostsettings.build_files(pip).items():
            path = Path(settings_dir, name)
            path.write_bytes(content)
            path.chmod(0o644)
        os.chmod(settings_dir, 0o755)
        container = client.containers.create(
            raw, ["sh", "-c", install_script(package)],
            # Only the file's path: the settings themselves stay in the mount.
            environment={"PIP_CONFIG_FILE": f"{BUILD_MOUNT}/pip.conf"},
            mounts=[docker.types.Mount(BUILD_MOUNT, settings_dir, type="bind", read_only=True)],
            labels={"tflab.build": "base"},
        )
        try:
            container.start()
            with log_path.open("a") as log:
                for line in container.logs(stream=True, follow=True):
                    text = line.decode(errors="replace")
                    log.write(text)
                    if text.strip():
                        progress.detail(text.strip())
            status = container.wait()
            if status.get("StatusCode", 1) != 0:
                tail = container.logs(tail=3).decode(errors="replace").strip().splitlines()
                hint = tail[-1] if tail else "no output"
                advice = " (pass the CA bundle your network needs with --ca-bundle)" if "certificate" in hint.lower() else ""
                raise EngineError(f"pip install {package} in the base failed: {hint}{advice}; log: {log_path}")
            progress.step(f"committing {tag}")
            repository, version = tag.split(":")
            # The image's config is given whole: nothing of the build container's carries over.
            container.commit(
                repository=repository, tag=version,
                conf={
                    "Env": [
                        f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "LANG=C.UTF-8",
                    ],
                    "Cmd": ["bash"],
                    "Labels": {"tflab.image": "base", "tflab.recipe": recipe},
                },
            )
        finally:
            container.remove(force=True)
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)
