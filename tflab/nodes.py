"""The lab's containers through the docker SDK: find them, wait for them, copy into them."""

from __future__ import annotations

import os
import socket
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from tflab.errors import EngineError, UserError
from tflab.executor import exec_quiet

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


def print_logs(containers: dict[str, Container], follow: bool, tail: str) -> None:
    """The containers' logs on stdout, each line after its node's name; with `follow`, until Ctrl-C."""
    width = max(len(name) for name in containers)
    lock = threading.Lock()
    count: int | str = int(tail) if tail.isdigit() else "all"

    def show(name: str) -> None:
        pending = b""
        for chunk in containers[name].logs(stream=True, follow=follow, tail=count):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            with lock:
                for line in lines:
                    sys.stdout.write(f"{name:<{width}} | {line.decode(errors='replace')}\n")
                sys.stdout.flush()
        if pending:
            with lock:
                sys.stdout.write(f"{name:<{width}} | {pending.decode(errors='replace')}\n")

    if not follow:
        for name in containers:
            show(name)
        return
    threads = [threading.Thread(target=show, args=(name,), daemon=True) for name in containers]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)


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


def manifest(folder: Path, exclude: Path | None = None) -> dict[str, list[int]]:
    """What `up` compares to decide what to copy: every file's relative path, size and mtime."""
    out: dict[str, list[int]] = {}
    for path in _walk(folder, exclude):
        try:
            stat = path.stat()
        except OSError:
            continue  # a dangling link or a file gone meanwhile: nothing to copy
        out[str(path.relative_to(folder))] = [stat.st_size, stat.st_mtime_ns]
    return out


def pack(entries: list[tuple[Path, str]]) -> Path:
    """Files as a tar on disk, each under its name in the archive (streamed to every node from there)."""
    handle = tempfile.NamedTemporaryFile(prefix="tflab-copy-", suffix=".tar", delete=False)
    try:
        # Links are followed: a node cannot see what a link on the host points to.
        with tarfile.open(fileobj=handle, mode="w", dereference=True) as tar:
            for path, name in entries:
                try:
                    tar.add(path, arcname=name, recursive=False)
                except OSError as exc:
                    raise UserError(f"cannot read {path} to copy it into the nodes: {exc.strerror or exc}") from exc
    finally:
        handle.close()
    return Path(handle.name)


def copy_into(client: docker.DockerClient, container: Container, archive: Path,
              removed: tuple[str, ...] = ()) -> None:
    """Unpack `archive` at / in `container` (files replaced in place), and delete the `removed` paths."""
    with archive.open("rb") as data:
        try:
            ok = client.api.put_archive(container.id, "/", data)
        except docker.errors.APIError as exc:
            raise EngineError(f"copying into {container.name} failed: {exc.explanation or exc}") from exc
    if not ok:
        raise EngineError(f"copying into {container.name} failed")
    for start in range(0, len(removed), 200):
        code, out = exec_quiet(client, container, ["rm", "-f", "--", *removed[start:start + 200]])
        if code != 0:
            raise EngineError(f"cannot remove old files in {container.name}: {out.strip()}")


def probe_links(client: docker.DockerClient, image: str, env: dict[str, str], project: str) -> str | None:
    """Run the node's link shaping in a throwaway container; None when it works, else what tc said."""
    try:
        client.containers.run(
            image, entrypoint=["/usr/local/share/tflab/shape.sh"], environment=env, cap_add=["NET_ADMIN"],
            remove=True, labels={"tflab.lab": project, "tflab.probe": "links"}, stdout=True, stderr=True,
        )
    except docker.errors.ContainerError as exc:
        text = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or exc)
        return text.strip() or str(exc)
    except docker.errors.APIError as exc:
        raise EngineError(f"cannot try the lab's link shaping: {exc.explanation or exc}") from exc
    return None


QDISC_PROBE = """
for q in tbf htb netem; do
  case $q in
    tbf) args="rate 1mbit burst 32kbit latency 100ms" ;;
    htb) args="default 1" ;;
    netem) args="delay 1ms" ;;
  esac
  if out=$(tc qdisc add dev eth0 root $q $args 2>&1); then
    echo "$q ok"; tc qdisc del dev eth0 root
  else
    echo "$q missing: $out" | head -n 1
  fi
done
"""


def probe_qdiscs(client: docker.DockerClient, image: str) -> dict[str, str | None]:
    """Which queueing disciplines the host kernel offers containers: qdisc -> None, or why it is missing."""
    try:
        output = client.containers.run(image, ["sh", "-c", QDISC_PROBE], entrypoint=[], cap_add=["NET_ADMIN"],
                                       remove=True, labels={"tflab.probe": "qdiscs"})
    except docker.errors.DockerException as exc:
        raise EngineError(f"cannot probe the kernel's qdiscs: {exc}") from exc
    found: dict[str, str | None] = {}
    for line in output.decode(errors="replace").splitlines():
        name, _, rest = line.partition(" ")
        if rest == "ok":
            found[name] = None
        elif rest.startswith("missing: "):
            found[name] = rest[len("missing: "):].strip() or "refused"
    return found
