"""The lab's containers through the docker SDK: find them, wait for them, copy into them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from tflab.engine.executors import exec_quiet
from tflab.errors import EngineError
from tflab.host.fanout import merged


def labelled(client: docker.DockerClient, label: str) -> list[Container]:
    """Every container (running or not) with `label`, leaving out any removed while they were listed.

    The SDK lists, then inspects each container; one that a swarm or `compose` removes in
    between would otherwise fail the whole call with "No such container".
    """
    return client.containers.list(all=True, filters={"label": label}, ignore_removed=True)


# Is sshd listening on port 22: a LISTEN line (state 0A, no peer) in the node's own /proc/net/tcp or tcp6. `status`
# asks each compose node so when it is run; the stack file's healthcheck (templates/_node.j2) asks the same.
SSHD_LISTENS = ("grep", "-qsE", "^ *[0-9]+: [0-9A-F]+:0016 [0-9A-F]+:0000 0A ", "/proc/net/tcp", "/proc/net/tcp6")


def lab_containers(client: docker.DockerClient, project: str) -> dict[str, Container]:
    """The lab's containers by node name, found by the lab's label (running or not)."""
    return {c.labels.get("tflab.node", c.name): c for c in labelled(client, f"tflab.lab={project}")}


def sshd_health(client: docker.DockerClient, container: Container) -> str:
    """`healthy` when the running node's sshd listens now, else `unhealthy` (asked now, not the engine's last check)."""
    try:
        code, _ = exec_quiet(client, container, SSHD_LISTENS)
    except EngineError:
        return "unhealthy"
    return "healthy" if code == 0 else "unhealthy"


def state_of(container: Container) -> tuple[str, str]:
    """(state, health) of a container as `status` shows them."""
    state = container.attrs.get("State", {})
    health = (state.get("Health") or {}).get("Status", "-")
    status = state.get("Status", container.status)
    if status == "exited":
        status = f"exited ({state.get('ExitCode', '?')})"
    return status, health if status == "running" else "-"


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines out of a stream of byte chunks (the last one even without its newline)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def log_lines(containers: dict[str, Container], follow: bool, tail: str) -> Iterator[tuple[str, str]]:
    """(node, line) of the containers' own logs: one node after the other, or, with `follow`, as they come."""
    count: int | str = int(tail) if tail.isascii() and tail.isdigit() else "all"
    streams = {name: lines_of(c.logs(stream=True, follow=follow, tail=count)) for name, c in containers.items()}
    if follow:
        yield from merged(streams)
        return
    for name, lines in streams.items():
        for line in lines:
            yield name, line


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
