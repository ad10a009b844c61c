"""What the node image and the local base builds share: progress, logs, results, image lookups."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from tflab.host import buildsettings, proc
from tflab.host.buildsettings import BUILD_MOUNT, PipSettings


def _ignore(_text: str) -> None:
    return None


@dataclass(frozen=True)
class Progress:
    """Where a long operation reports: its own steps, and the chatter of the tools it runs.

    Off a terminal only the steps are shown; on one, a spinner shows the latest detail.
    """

    step: Callable[[str], None] = field(default=_ignore)
    detail: Callable[[str], None] = field(default=_ignore)


@dataclass(frozen=True)
class BuildResult:
    """What a build produced, and whether it did any work."""

    tag: str
    image_id: str
    built: bool
    log: Path | None = None


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


def run_logged(argv: list[str], log: TextIO, progress: Progress) -> int:
    """Run `argv`, writing every line to `log` and showing it as detail; its exit code."""

    def on_line(line: str) -> None:
        log.write(line)
        if line.strip():
            progress.detail(line.strip())

    return proc.stream(argv, on_line)


@contextmanager
def settings_mount(pip: PipSettings) -> Iterator[docker.types.Mount]:
    """The host's build settings (pip.conf, proxy.env, ca.pem) as a read-only mount at BUILD_MOUNT.

    A build container reads them there; no image it is committed to, or imported from, keeps them.
    """
    with tempfile.TemporaryDirectory(prefix="tflab-build-") as folder:
        for name, content in buildsettings.build_files(pip).items():
            path = Path(folder, name)
            path.write_bytes(content)
            path.chmod(0o644)
        os.chmod(folder, 0o755)
        yield docker.types.Mount(BUILD_MOUNT, folder, type="bind", read_only=True)


def follow(container: Container, log_path: Path, progress: Progress) -> int:
    """Start a build container, its output into `log_path` (appended) and the progress' detail; its exit code."""
    container.start()
    with log_path.open("a") as log:
        for line in container.logs(stream=True, follow=True):
            text = line.decode(errors="replace")
            log.write(text)
            if text.strip():
                progress.detail(text.strip())
    return int(container.wait().get("StatusCode", 1))
