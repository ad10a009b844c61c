"""How tflab runs processes in nodes: through `docker exec` (the SDK) or over SSH.

An attached process keeps tflab's connection as its standard input, and the in-node guard
reads it a line at a time: `go` releases a held process, `stop` stops it (its whole group:
TERM, then KILL), and the end of the connection stops it too, which is what happens when
tflab dies (the engine or sshd closes it then). Its output is handed to `on_output` as it
comes; `on_exit` is called exactly once, from a `finally`, whatever happens to the stream.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import docker
import docker.errors
from docker.models.containers import Container
from docker.utils.socket import frames_iter

from tflab.errors import EngineError, UserError
from tflab.host import proc
from tflab.host.fanout import background

log = logging.getLogger("tflab.executor")
OnOutput = Callable[[bytes, bool], None]  # (chunk, is_stderr)
OnExit = Callable[[int | None, str | None], None]  # (exit code or None, why it is unknown)
GO = b"go\n"
STOP = b"stop\n"
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


class Attached(Protocol):
    """A process started in a node, attached to tflab."""

    def release(self) -> None:
        """Let a held process go on (the servers it needs serve now)."""

    def close(self) -> None:
        """Ask the guard to stop the process's group (TERM, then KILL)."""

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until its output has ended; whether it has."""


class Executor(Protocol):
    """Runs commands in the lab's nodes."""

    def start(self, node: str, argv: Sequence[str], on_output: OnOutput, on_exit: OnExit,
              env: Mapping[str, str] | None = None, workdir: str = "/workspace") -> Attached:
        """Start `argv` attached to tflab."""

    def run(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
            workdir: str = "/") -> tuple[int, str]:
        """Run `argv` to its end; its exit code and combined output."""

    def spawn(self, node: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              workdir: str = "/") -> None:
        """Start `argv` and leave it running in the node, detached from tflab."""


def _safe(on_output: OnOutput) -> OnOutput:
    """`on_output` that never breaks the reading loop: the process is read to its end whatever its reader does.

    The readers handle their own failures (a closed stdout ends the command: cli.common.StreamOut;
    a run's sink stops the run); anything else they raise is logged (`tflab -v`) and they are not
    called again, rather than kept in a list nobody reads.
    """
    failed: list[bool] = []

    def call(chunk: bytes, is_err: bool) -> None:
        if failed:
            return
        try:
            on_output(chunk, is_err)
        except Exception:  # noqa: BLE001 - the reader's own failure; the process is still read
            failed.append(True)
            log.debug("a process's output reader failed; its further output is dropped", exc_info=True)

    return call


def writable(connection: Any) -> Any:
    """Something to write to what `exec_start(socket=True)` returned.

    That is a socket (TLS, SSH) or, for a unix or TCP engine, the SDK's read-only socket file:
    a socket of our own over a duplicate of its descriptor writes to the same connection.
    """
    if hasattr(connection, "sendall"):
        return connection
    return socket.socket(fileno=os.dup(connection.fileno()))


class _GuardedProcess:
    """A process in a node whose guard reads tflab's connection: `go` releases it, `stop` stops it.

    `pump` reads its output to the end, then learns how it ended and calls `on_exit` once, from a
    `finally`. The two kinds differ in how they write to the guard (`_write`), read the output
    (`_stream`), learn the exit (`_exit_status`) and close the connection (`_close_ends`).
    """

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.closing = False
        self._lock = threading.Lock()

    def _say(self, line: bytes, last: bool = False) -> None:
        with self._lock:
            if self.ended.is_set():
                return
            try:
                self._write(line, last)
            except (OSError, ValueError):
                pass  # the process or its node is gone: nothing to tell

    def release(self) -> None:
        self._say(GO)

    def close(self) -> None:
        self.closing = True
        self._say(STOP, last=True)

    def wait(self, timeout: float | None = None) -> bool:
        return self.ended.wait(timeout)

    def pump(self, on_output: OnOutput, on_exit: OnExit) -> None:
        lost: str | None = None
        code: int | None = None
        reason: str | None = None
        try:
            self._stream(_safe(on_output))
        except Exception as exc:  # noqa: BLE001 - any break of the stream ends this process for us
            lost = f"lost the connection to it ({type(exc).__name__}: {exc})"
        finally:
            reason = lost
            try:
                code, why = self._exit_status(stream_lost=lost is not None)
                reason = why or reason
            except Exception as exc:  # noqa: BLE001
                reason = reason or f"cannot learn how it ended ({exc})"
            with self._lock:
                try:
                    self._close_ends()
                except Exception:  # noqa: BLE001
                    pass
                self.ended.set()
            on_exit(code, reason)

    def _write(self, line: bytes, last: bool) -> None:
        raise NotImplementedError

    def _stream(self, emit: OnOutput) -> None:
        raise NotImplementedError

    def _exit_status(self, stream_lost: bool) -> tuple[int | None, str | None]:
        raise NotImplementedError

    def _close_ends(self) -> None:
        raise NotImplementedError


class _DockerProcess(_GuardedProcess):
    """A `docker exec` through the SDK: the guard's input and the output are one socket."""

    def __init__(self, api: docker.APIClient, exec_id: str, connection: Any, container: Container) -> None:
        super().__init__()
        self.api = api
        self.exec_id = exec_id
        self.connection = connection
        self.writer = writable(connection)
        self.container = container

    def _write(self, line: bytes, last: bool) -> None:
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
              env: Mapping[str, str] | None = None, workdir: str = "/workspace") -> Attached:
        container = self.container(node)
        api = self.client.api
        try:
            exec_id = api.exec_create(container.id, list(argv), stdin=True, stdout=True, stderr=True,
                                      tty=False, environment=dict(env or {}), workdir=workdir)["Id"]
            connection = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"starting a process in {node} failed: {exc.explanation or exc}") from exc
        process = _DockerProcess(api, exec_id, connection, container)
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


class _SshProcess(_GuardedProcess):
    """An ssh client: the guard's input is its stdin, the output its stdout and stderr."""

    def __init__(self, child: Any) -> None:
        super().__init__()
        self.child = child
        self.tail: list[bytes] = []  # stderr's last chunks: ssh's own complaint, when it fails

    def _write(self, line: bytes, last: bool) -> None:
        stdin: IO[bytes] | None = self.child.stdin
        assert stdin is not None
        stdin.write(line)
        stdin.flush()
        if last:
            stdin.close()

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
        pass  # the pipes close with the child


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
              env: Mapping[str, str] | None = None, workdir: str = "/workspace") -> Attached:
        command = self.ssh_argv(node, self.remote(argv, env, workdir))
        # Its own session: a Ctrl-C at the terminal reaches tflab, which stops things in order.
        child = proc.start(command, stdin=proc.PIPE, stdout=proc.PIPE, stderr=proc.PIPE, new_session=True)
        process = _SshProcess(child)
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
