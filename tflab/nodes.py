"""The lab's containers through the docker SDK: find them, run in them, copy into them."""

from __future__ import annotations

import hashlib
import os
import socket
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from tflab.errors import EngineError, UserError

Output = Callable[[bytes, bool], None]  # (chunk, is_stderr)
SKIP_NAMES = {"__pycache__", ".git", ".pytest_cache", ".ipynb_checkpoints"}


def lab_containers(client: docker.DockerClient, project: str) -> dict[str, Container]:
    """The lab's containers by node name, found by the lab's label (running or not)."""
    found = client.containers.list(all=True, filters={"label": f"tflab.lab={project}"})
    return {c.labels.get("tflab.node", c.name): c for c in found}


def running_container(client: docker.DockerClient, project: str, node: str) -> Container:
    """The running container of `node`, or a UserError saying the lab (or node) is not up."""
    containers = lab_containers(client, project)
    container = containers.get(node)
    if container is None:
        raise UserError(f"node {node} is not up; run `tflab up` first")
    if container.status != "running":
        raise UserError(f"node {node} is {container.status}, not running; `tflab up` starts it again")
    return container


def state_of(container: Container) -> tuple[str, str]:
    """(state, health) of a container as `status` shows them."""
    state = container.attrs.get("State", {})
    health = (state.get("Health") or {}).get("Status", "-")
    status = state.get("Status", container.status)
    if status == "exited":
        status = f"exited ({state.get('ExitCode', '?')})"
    return status, health if status == "running" else "-"


def exec_stream(
    client: docker.DockerClient, container: Container, argv: Sequence[str], on_output: Output,
    env: dict[str, str] | None = None, workdir: str = "/workspace",
) -> int:
    """Run `argv` in `container`, hand its output over as it comes, return its exit code."""
    api = client.api
    try:
        exec_id = api.exec_create(
            container.id, list(argv), environment=env or {}, workdir=workdir, stdout=True,
            stderr=True, tty=False,
        )["Id"]
        for stdout, stderr in api.exec_start(exec_id, stream=True, demux=True):
            if stdout:
                on_output(stdout, False)
            if stderr:
                on_output(stderr, True)
        code = api.exec_inspect(exec_id).get("ExitCode")
    except docker.errors.APIError as exc:
        raise EngineError(f"running a command in {container.name} failed: {exc.explanation or exc}") from exc
    return 137 if code is None else int(code)


def exec_quiet(
    client: docker.DockerClient, container: Container, argv: Sequence[str],
    env: dict[str, str] | None = None, workdir: str = "/",
) -> tuple[int, str]:
    """Run `argv` in `container`; its exit code and combined output."""
    chunks: list[bytes] = []
    code = exec_stream(client, container, argv, lambda b, _e: chunks.append(b), env, workdir)
    return code, b"".join(chunks).decode(errors="replace")


def exec_detached(client: docker.DockerClient, container: Container, argv: Sequence[str]) -> None:
    """Start `argv` in `container` and leave it running there."""
    try:
        exec_id = client.api.exec_create(container.id, list(argv), workdir="/runs")["Id"]
        client.api.exec_start(exec_id, detach=True)
    except docker.errors.APIError as exc:
        raise EngineError(f"starting {argv[0]} in {container.name} failed: {exc.explanation or exc}") from exc


def wait_for_http(url: str, deadline: float) -> bool:
    """Wait until `url` answers 200, or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    return False


def wait_for_ssh(host: str, port: int, deadline: float) -> bool:
    """Wait until an SSH server answers its banner on host:port, or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.settimeout(2)
                if sock.recv(16).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def _walk(folder: Path, exclude: Path | None) -> Iterable[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIP_NAMES and (exclude is None or Path(root, d).resolve() != exclude)
        )
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(root, name)


def fingerprint(folder: Path, exclude: Path | None = None) -> str:
    """What `up` compares to decide a copy is stale: every file's path, size and mtime."""
    digest = hashlib.sha256()
    for path in _walk(folder, exclude):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def pack(folder: Path, exclude: Path | None = None) -> Path:
    """`folder`'s files as a tar on disk (streamed to every node without holding it in memory)."""
    handle = tempfile.NamedTemporaryFile(prefix="tflab-copy-", suffix=".tar", delete=False)
    with tarfile.open(fileobj=handle, mode="w") as tar:
        for path in _walk(folder, exclude):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    handle.close()
    return Path(handle.name)


def copy_into(client: docker.DockerClient, container: Container, archive: Path, target: str) -> None:
    """Replace `target`'s contents in `container` with the files of `archive`."""
    code, out = exec_quiet(
        client, container,
        ["sh", "-c", 'mkdir -p "$1" && find "$1" -mindepth 1 -delete', "sh", target],
    )
    if code != 0:
        raise EngineError(f"cannot clear {target} in {container.name}: {out.strip()}")
    with archive.open("rb") as data:
        if not client.api.put_archive(container.id, target, data):
            raise EngineError(f"copying into {target} of {container.name} failed")
