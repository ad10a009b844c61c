"""How tflab runs processes in nodes: through `docker exec` (the SDK) or over SSH.

What a process attached to tflab is, whatever carries it (its words, its lease, reading it to
its end and attaching again after a break), is engine/attached.py; here are the two transports.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import docker
import docker.errors
from docker.models.containers import Container
from docker.utils.socket import frames_iter

from tflab.engine.attached import Attached, GuardedProcess, OnExit, OnOutput, Reattach
from tflab.errors import EngineError, UserError
from tflab.host import proc
from tflab.host.fanout import background

SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "IdentitiesOnly=yes")
# For commands tflab runs itself: never a prompt, and a dead peer noticed within seconds.
SSH_BATCH_OPTIONS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
                     "-o", "ServerAliveCountMax=3")


def ssh_argv(target: tuple[str, int], key: Path | str, options: Sequence[str], remote: str | Sequence[str]) -> list[str]:
    """ssh to a node through its published port with the lab key.

    `remote` is a shell line as it is, or words that keep their quoting (ssh joins its
    last words with spaces for the remote shell, so they are quoted first).
    """
    host, port = target
    line = remote if isinstance(remote, str) else (shlex.join(remote) if remote else "")
    return ["ssh", "-i", str(key), "-p", str(port), *options, *SSH_OPTIONS, f"root@{host}", *([line] if line else [])]


class Executor(Protocol):
    """Runs commands in the lab's nodes."""

    def start(self, node: str, argv: Sequence[str], on_output: OnOutput, on_exit: OnExit,
              env: Mapping[str, str] | None = None, workdir: str = "/workspace", renew: bool = False,
              resume: Reattach | None = None) -> Attached:
        """Start `argv` attached to tflab; `renew` says `renew` every second (its lease), `resume` attaches
        again where the connection breaks while it runs, or ends before all of its output came through."""

    def run(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
            workdir: str = "/") -> tuple[int, str]:
        """Run `argv` to its end; its exit code and combined output."""

    def spawn(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              workdir: str = "/") -> None:
        """Start `argv` and leave it running in the node, detached from tflab."""


def writable(connection: Any) -> Any:
    """Something to write to what `exec_start(socket=True)` returned.

    That is a socket (TLS, SSH) or, for a unix or TCP engine, the SDK's read-only socket file:
    a socket of our own over a duplicate of its descriptor writes to the same connection.
    """
    if hasattr(connection, "sendall"):
        return connection
    return socket.socket(fileno=os.dup(connection.fileno()))


class _DockerProcess(GuardedProcess):
    """A `docker exec` through the SDK: the guard's input and the output are one socket."""

    def __init__(self, api: docker.APIClient, exec_id: str, connection: Any, container: Container,
                 renew: bool = False, resume: Reattach | None = None) -> None:
        super().__init__(renew, resume)
        self.api = api
        self.exec_id = exec_id
        self.connection = connection
        self.writer = writable(connection)
        self.container = container

    def _restart(self, argv: Sequence[str]) -> None:
        self.exec_id, self.connection = open_exec(self.api, self.container, argv, {}, "/")
        self.writer = writable(self.connection)

    def _write(self, line: bytes) -> None:
        self.writer.sendall(line)

    def _stream(self, emit: OnOutput) -> None:
        for stream, data in frames_iter(self.connection, tty=False):
            if data:
                emit(data, stream == 2)

    def _close_ends(self) -> None:
        for end in {id(self.connection): self.connection, id(self.writer): self.writer}.values():
            try:
                end.close()
            except Exception:  # noqa: BLE001
                pass

    def _container_stopping(self, wait_s: float) -> bool:
        """Whether the container is stopping or gone (a killed process may be the first sign of it)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.container.reload()
                if self.container.status != "running":
                    return True
            except docker.errors.DockerException:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def _container_stopped(self) -> bool:
        return not self.closing and self._container_stopping(wait_s=3.0)

    def _exit_status(self, stream_lost: bool) -> tuple[int | None, str | None]:
        """The exit code; None with a reason when the engine cannot tell (it may still run)."""
        deadline = time.monotonic() + 2.0
        while True:
            try:
                info = self.api.exec_inspect(self.exec_id)
            except docker.errors.NotFound:
                return None, "its container is gone"
            except docker.errors.APIError as exc:
                return None, f"the engine cannot say how it ended ({exc.explanation or exc})"
            if not info.get("Running"):
                break
            if time.monotonic() > deadline:
                return None, "lost the connection to it while it still ran"
            time.sleep(0.05)
        code = info.get("ExitCode")
        # A process killed from outside may be the first sign that its container is stopping.
        unexpected = code in (None, 137, 143) and not self.closing
        stopped = self._container_stopping(wait_s=3.0 if unexpected else 0.0)
        if stopped:
            return code, "its container stopped"
        return (None, "the engine reported no exit code") if code is None else (int(code), None)


class DockerExecutor:
    """`docker exec` in the lab's containers, through the SDK."""

    def __init__(self, client: docker.DockerClient, containers: Mapping[str, Container]) -> None:
        self.client = client
        self.containers = dict(containers)

    def container(self, node: str) -> Container:
        if node not in self.containers:
            raise UserError(f"node {node} is not up; run `tflab up` first")
        return self.containers[node]

    def start(self, node: str, argv: Sequence[str], on_output: OnOutput, on_exit: OnExit,
              env: Mapping[str, str] | None = None, workdir: str = "/workspace", renew: bool = False,
              resume: Reattach | None = None) -> Attached:
        container = self.container(node)
        api = self.client.api
        try:
            exec_id, connection = open_exec(api, container, argv, env, workdir)
        except docker.errors.APIError as exc:
            raise EngineError(f"starting a process in {node} failed: {exc.explanation or exc}") from exc
        process = _DockerProcess(api, exec_id, connection, container, renew, resume)
        background(process.pump, on_output, on_exit, name=f"output-{node}")
        return process

    def run(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
            workdir: str = "/") -> tuple[int, str]:
        return exec_quiet(self.client, self.container(node), argv, env, workdir)

    def spawn(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              workdir: str = "/") -> None:
        container = self.container(node)
        try:
            exec_id = self.client.api.exec_create(container.id, list(argv), environment=dict(env or {}),
                                                  workdir=workdir)["Id"]
            self.client.api.exec_start(exec_id, detach=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"starting {argv[0]} in {node} failed: {exc.explanation or exc}") from exc


def open_exec(api: docker.APIClient, container: Container, argv: Sequence[str], env: Mapping[str, str] | None,
              workdir: str) -> tuple[str, Any]:
    """A `docker exec` of `argv` with its standard input, output and error as one socket."""
    exec_id = api.exec_create(container.id, list(argv), stdin=True, stdout=True, stderr=True,
                              tty=False, environment=dict(env or {}), workdir=workdir)["Id"]
    return exec_id, api.exec_start(exec_id, socket=True)


def exec_quiet(client: docker.DockerClient, container: Container, argv: Sequence[str],
               env: Mapping[str, str] | None = None, workdir: str = "/") -> tuple[int, str]:
    """Run `argv` in `container` to its end; its exit code and combined output."""
    api = client.api
    try:
        exec_id = api.exec_create(container.id, list(argv), environment=dict(env or {}), workdir=workdir,
                                  stdout=True, stderr=True, tty=False)["Id"]
        output = api.exec_start(exec_id, stream=False)
        code = api.exec_inspect(exec_id).get("ExitCode")
    except docker.errors.APIError as exc:
        raise EngineError(f"running {argv[0]} in {container.name} failed: {exc.explanation or exc}") from exc
    text = output.decode(errors="replace") if isinstance(output, bytes) else str(output)
    if code is None:
        raise EngineError(f"running {argv[0]} in {container.name}: the engine reported no exit code")
    return int(code), text


class _SshProcess(GuardedProcess):
    """An ssh client: the guard's input is its stdin, the output its stdout and stderr."""

    def __init__(self, child: Any, start_child: Callable[[Sequence[str]], Any] | None = None,
                 renew: bool = False, resume: Reattach | None = None) -> None:
        super().__init__(renew, resume)
        self.child = child
        self.start_child = start_child
        self.tail: list[bytes] = []  # stderr's last chunks: ssh's own complaint, when it fails

    def _restart(self, argv: Sequence[str]) -> None:
        assert self.start_child is not None
        self.tail = []
        self.child = self.start_child(argv)

    def _write(self, line: bytes) -> None:
        stdin: IO[bytes] | None = self.child.stdin
        assert stdin is not None
        stdin.write(line)
        stdin.flush()

    def _stream(self, emit: OnOutput) -> None:
        def read(stream: Any, is_err: bool) -> None:
            for chunk in iter(lambda: stream.read1(65536), b""):
                if is_err:
                    self.tail[:] = (self.tail + [chunk])[-4:]
                emit(chunk, is_err)

        err_thread = background(read, self.child.stderr, True, name="ssh-stderr")
        read(self.child.stdout, False)
        err_thread.join(10)

    def _exit_status(self, stream_lost: bool) -> tuple[int | None, str | None]:
        code = self.child.poll() if stream_lost else self.child.wait()
        if code is None:
            return None, None  # the stream broke with ssh still running: the reason is the break
        if code == 255:
            last = b"".join(self.tail).decode(errors="replace").strip().splitlines()
            return None, f"ssh failed: {last[-1] if last else 'no output'}"
        return code, None

    def _close_ends(self) -> None:
        if self.child.poll() is None and self.resumed and not self.ended.is_set():
            self.child.kill()  # a client whose connection broke: the next one attaches instead


class SshExecutor:
    """Commands in nodes over SSH with the lab key, through each node's published port.

    Used where a node runs on another host (swarm), and selectable with `--via ssh`.
    """

    def __init__(self, targets: Mapping[str, tuple[str, int]], key: str | Path,
                 runner: Callable[..., proc.Completed] = proc.call) -> None:
        self.targets = dict(targets)
        self.key = key
        self.runner = runner

    def ssh_argv(self, node: str, remote: str) -> list[str]:
        """ssh running the shell line `remote` on `node`, as tflab runs its own commands (no prompt)."""
        if node not in self.targets:
            raise UserError(f"node {node} is not up; run `tflab up` first")
        return ssh_argv(self.targets[node], self.key, SSH_BATCH_OPTIONS, remote)

    @staticmethod
    def remote(argv: Sequence[str], env: Mapping[str, str] | None, workdir: str) -> str:
        """One shell line for sshd: the node's login environment is there already (entrypoint)."""
        assigned = [f"{k}={v}" for k, v in (env or {}).items()]
        return f"cd {shlex.quote(workdir)} && exec env {shlex.join([*assigned, *argv])}"

    def start(self, node: str, argv: Sequence[str], on_output: OnOutput, on_exit: OnExit,
              env: Mapping[str, str] | None = None, workdir: str = "/workspace", renew: bool = False,
              resume: Reattach | None = None) -> Attached:
        def start_child(words: Sequence[str], env: Mapping[str, str] | None = None, workdir: str = "/") -> Any:
            command = self.ssh_argv(node, self.remote(words, env, workdir))
            # Its own session: a Ctrl-C at the terminal reaches tflab, which stops things in order.
            return proc.start(command, stdin=proc.PIPE, stdout=proc.PIPE, stderr=proc.PIPE, new_session=True)

        process = _SshProcess(start_child(argv, env, workdir), start_child, renew, resume)
        background(process.pump, on_output, on_exit, name=f"ssh-{node}")
        return process

    def run(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
            workdir: str = "/") -> tuple[int, str]:
        return self.run_line(node, self.remote(argv, env, workdir))

    def run_line(self, node: str, line: str, stdin: IO[bytes] | None = None, timeout: float = 600) -> tuple[int, str]:
        """A shell line on `node` to its end (with `stdin` as its input); exit code and output."""
        done = self.runner(self.ssh_argv(node, line), stdin=stdin if stdin is not None else proc.DEVNULL,
                           timeout=timeout)
        if done.returncode == 255:
            last = done.output.strip().splitlines()[-1] if done.output.strip() else "no output"
            raise EngineError(f"cannot reach {node} over SSH: {last}")
        return done.returncode, done.output

    def spawn(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              workdir: str = "/") -> None:
        assigned = [f"{k}={v}" for k, v in (env or {}).items()]
        # `;`, not `&&`: only the command goes to the background, with none of the session's
        # descriptors (a backgrounded list would keep them, and the session open, until it ends).
        line = (f"cd {shlex.quote(workdir)} || exit 1; nohup env {shlex.join([*assigned, *argv])} "
                "</dev/null >/dev/null 2>&1 &")
        code, out = self.run_line(node, line)
        if code != 0:
            raise EngineError(f"starting {argv[0]} in {node} over SSH failed: {out.strip()}")
