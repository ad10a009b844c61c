"""Images: the node image (TensorFlow + sshd) and, where no registry is reachable, a local base."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import docker
import docker.errors
import docker.types

from tflab import config as cfg
from tflab.errors import EngineError, UserError
from tflab.hostsettings import AptMirror, PipSettings

Progress = Callable[[str], None]
BASE_PACKAGES = (
    "python3", "python3-venv", "openssh-server", "openssh-client", "ca-certificates",
    "procps", "iproute2", "bash", "util-linux", "passwd",
)
EXTRA_PIP = ("tensorboard",)  # TensorFlow 2.20+ no longer brings it; `tflab tensorboard` needs it
VENV = "/opt/tensorflow"
CONTAINER_CA = "/tmp/tflab-host-ca.pem"


def log_dir() -> Path:
    """Where build logs are kept ($XDG_CACHE_HOME/tflab/logs)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tflab" / "logs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def new_log(kind: str) -> Path:
    """A fresh build log file for `kind` (base, node)."""
    return log_dir() / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    """Whether the engine has an image called `ref`."""
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


@dataclass(frozen=True)
class BuildResult:
    """What a build produced, and whether it did any work."""

    tag: str
    image_id: str
    built: bool
    log: Path | None = None


def tar_context(files: dict[str, bytes]) -> io.BytesIO:
    """A build context as an in-memory tar (the context is a few small files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


def build_node(
    client: docker.DockerClient, context: dict[str, bytes], tag: str, progress: Progress,
    force: bool = False,
) -> BuildResult:
    """Build the node image as `tag` unless the engine has it already."""
    if not force and image_exists(client, tag):
        return BuildResult(tag, client.images.get(tag).id, built=False)
    log_path = new_log("node")
    with log_path.open("w") as log:
        try:
            for chunk in client.api.build(
                fileobj=tar_context(context), custom_context=True, tag=tag, rm=True,
                forcerm=True, decode=True,
            ):
                if "stream" in chunk:
                    text = chunk["stream"]
                    log.write(text)
                    if text.strip():
                        progress(text.strip())
                elif "status" in chunk:
                    log.write(f"{chunk['status']} {chunk.get('progress', '')}\n")
                    progress(f"{chunk['status']} {chunk.get('id', '')}".strip())
                elif "error" in chunk:
                    log.write(chunk["error"] + "\n")
                    raise EngineError(node_build_advice(chunk["error"], log_path))
        except docker.errors.APIError as exc:
            log.write(str(exc) + "\n")
            raise EngineError(node_build_advice(str(exc), log_path)) from exc
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)


def node_build_advice(error: str, log_path: Path) -> str:
    """One sentence on a failed node build: what failed, what to do, where the log is."""
    first = error.strip().splitlines()[0] if error.strip() else "unknown error"
    if "pull access denied" in error or "not found" in error or "no such host" in error or "dial tcp" in error:
        return (
            f"the node image's base could not be pulled ({first}); with no registry, "
            f"generate the lab with --base local (tflab builds that base itself); log: {log_path}"
        )
    return f"building the node image failed: {first}; log: {log_path}"


def run_logged(argv: list[str], log: TextIO, progress: Progress) -> int:
    """Run `argv`, writing every line to `log` and showing it as progress; its exit code."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            log.write(line)
            if line.strip():
                progress(line.strip())
        return child.wait()


def pull(client: docker.DockerClient, ref: str, progress: Progress) -> None:
    """Pull a base image from its registry, or say how to do without one."""
    repository, _, tag = ref.partition(":")
    try:
        for chunk in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if "status" in chunk:
                progress(f"pull {ref}: {chunk['status']} {chunk.get('progress', '')}".strip())
            if "error" in chunk:
                raise docker.errors.APIError(chunk["error"])
    except docker.errors.APIError as exc:
        raise EngineError(
            f"cannot pull {ref} ({str(exc).splitlines()[0][:160]}); with no registry, generate the "
            "lab with --base local (tflab builds that base itself)"
        ) from exc


def base_tag(gpu: bool) -> str:
    """The local base's tag (the CPU or GPU build of TensorFlow)."""
    return cfg.LOCAL_GPU_BASE if gpu else cfg.LOCAL_BASE


def build_base(
    client: docker.DockerClient, mirror: AptMirror, pip: PipSettings, progress: Progress,
    gpu: bool = False, force: bool = False, tensorflow: str | None = None,
) -> BuildResult:
    """A base image from the distribution's own packages: debootstrap, docker import, pip.

    pip runs in a container that sees the host's CA bundle and pip settings (a bind mount:
    the bundle is used, never stored in the image).
    """
    tag = base_tag(gpu)
    package = tensorflow or ("tensorflow[and-cuda]" if gpu else "tensorflow-cpu")
    recipe = base_recipe(mirror, package)
    if not force and image_exists(client, tag):
        existing = client.images.get(tag)
        if existing.labels.get("tflab.recipe") == recipe:
            return BuildResult(tag, existing.id, built=False)
        progress(f"{tag} was built from another recipe: building it again")
    if shutil.which("debootstrap") is None:
        raise UserError("debootstrap is not installed; run `apt-get install debootstrap` (as root)")
    if os.geteuid() != 0:
        raise UserError("building the local base needs root (debootstrap); run `sudo tflab base`")
    log_path = new_log("base")
    raw = f"tflab-base-raw:{os.getpid()}"
    with log_path.open("w") as log, tempfile.TemporaryDirectory(prefix="tflab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        progress(f"debootstrap {mirror.suite} from {mirror.uri}")
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
        progress("importing the root file system into the engine")
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE
        )
        try:
            client.api.import_image(src=tar.stdout, repository=raw.split(":")[0], tag=raw.split(":")[1])
        finally:
            tar.wait()
    return _install_tensorflow(client, raw, tag, package, recipe, pip, progress, log_path)


def base_recipe(mirror: AptMirror, package: str) -> str:
    """A short hash of what the local base is made from (a changed recipe rebuilds it)."""
    text = "\n".join([mirror.uri, mirror.suite, *BASE_PACKAGES, package, *EXTRA_PIP, VENV])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _install_tensorflow(
    client: docker.DockerClient, raw: str, tag: str, package: str, recipe: str, pip: PipSettings,
    progress: Progress, log_path: Path,
) -> BuildResult:
    """pip install TensorFlow into a venv on the raw base, then commit it as `tag`."""
    env = dict(pip.env)
    mounts = []
    if pip.ca_bundle is not None:
        # A bind mount in the host config only: the image keeps no trace of it.
        mounts.append(docker.types.Mount(CONTAINER_CA, str(pip.ca_bundle), type="bind", read_only=True))
        env["PIP_CERT"] = CONTAINER_CA
    script = (
        f"set -e; python3 -m venv {VENV}; "
        f"{VENV}/bin/pip install --no-cache-dir --progress-bar off '{package}' {' '.join(EXTRA_PIP)}; "
        f"{VENV}/bin/python -c 'import tensorflow as tf; print(\"TensorFlow\", tf.__version__)'"
    )
    progress(f"pip install {package}")
    # Settings go on the command line (`env`), not in the container's config, which the
    # commit below would otherwise carry into the image.
    command = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), "sh", "-c", script]
    container = client.containers.create(raw, command, mounts=mounts, labels={"tflab.build": "base"})
    try:
        container.start()
        with log_path.open("a") as log:
            for line in container.logs(stream=True, follow=True):
                text = line.decode(errors="replace")
                log.write(text)
                if text.strip():
                    progress(text.strip())
        status = container.wait()
        if status.get("StatusCode", 1) != 0:
            tail = container.logs(tail=3).decode(errors="replace").strip().splitlines()
            hint = tail[-1] if tail else "no output"
            advice = ""
            if "certificate" in hint.lower():
                advice = " (pass the CA bundle your network needs with --ca-bundle)"
            raise EngineError(f"pip install {package} in the base failed: {hint}{advice}; log: {log_path}")
        repository, version = tag.split(":")
        # The image's config is given whole: the build's pip and proxy settings stay out of it.
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
        try:
            client.images.remove(raw, force=True)
        except docker.errors.APIError:
            pass
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)
