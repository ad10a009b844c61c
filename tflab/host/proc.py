"""The one way tflab runs external commands: argv lists (never shell strings), logged, timed out, cleaned up.

- `run` / `call`: a command to its end, stdout and stderr kept apart; `run` raises on failure.
- `stream`: a command whose merged output is handed over line by line (build logs).
- `start`: a child that lives on beside tflab (an SSH session, a detached run); `spawned`
  is the same as a context manager that kills and reaps the child if the block fails.
- `interactive`: a command on the user's terminal (`docker exec -it`, `ssh`).

Every failure is a CommandError carrying the command, its exit code and both outputs; a
program that is not installed is a UserError saying so.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from tflab.errors import CommandError, UserError

log = logging.getLogger("tflab.proc")
DEFAULT_TIMEOUT_S = 600.0
PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


class Runner(Protocol):
    """Runs an argv list and returns its standard output (raises CommandError on failure)."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> str: ...


@dataclass(frozen=True)
class Completed:
    """A command that ran to its end."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """Both outputs, stdout first (for messages)."""
        return self.stdout + self.stderr


def _argv(argv: Sequence[Any]) -> list[str]:
    words = [str(a) for a in argv]
    log.debug("run: %s", " ".join(words))
    return words


def _not_installed(argv: list[str], exc: FileNotFoundError) -> UserError:
    return UserError(f"`{argv[0]}` is not installed or not on PATH")


def call(
    argv: Sequence[Any],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input: str | bytes | None = None,
    stdin: IO[bytes] | int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Completed:
    """Run `argv` to its end (killed after `timeout` seconds); its exit code and both outputs, never raising on a code."""
    words = _argv(argv)
    binary = isinstance(input, bytes)
    try:
        done = subprocess.run(
            words, env=dict(env) if env is not None else None, cwd=str(cwd) if cwd is not None else None,
            input=input, stdin=stdin if input is None else None, capture_output=True, text=not binary,
            errors=None if binary else "replace", timeout=timeout, check=False,
        )
    except FileNotFoundError as exc:
        raise _not_installed(words, exc) from exc
    except subprocess.TimeoutExpired as exc:  # subprocess.run killed and reaped it
        raise CommandError(words, None, _text(exc.stdout), _text(exc.stderr),
                           why=f"did not finish within {timeout:g}s") from exc
    return Completed(words, done.returncode, _text(done.stdout), _text(done.stderr))


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def run(
    argv: Sequence[Any],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> str:
    """Run `argv`, return its stdout; raise CommandError (stdout and stderr apart) on failure."""
    done = call(argv, env=env, cwd=cwd, input=input, timeout=timeout)
    if done.returncode != 0:
        raise CommandError(done.argv, done.returncode, done.stdout, done.stderr)
    return done.stdout


def stream(argv: Sequence[Any], on_line: Callable[[str], None], *, env: Mapping[str, str] | None = None,
           timeout: float | None = None) -> int:
    """Run `argv`, handing each line of its merged output to `on_line`; its exit code.

    The child is killed and reaped if `on_line` raises or the caller is interrupted.
    """
    with spawned(argv, stdout=PIPE, stderr=STDOUT, env=env) as child:
        assert child.stdout is not None
        for raw in child.stdout:
            on_line(raw.decode(errors="replace"))
        try:
            return child.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise CommandError(_argv(argv), None, "", "", why=f"did not finish within {timeout:g}s") from exc


def start(
    argv: Sequence[Any],
    *,
    stdin: IO[Any] | int | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start `argv` and leave it running (binary pipes where asked); the caller owns it from here."""
    words = _argv(argv)
    try:
        return subprocess.Popen(words, stdin=stdin, stdout=stdout, stderr=stderr,
                                env=dict(env) if env is not None else None,
                                cwd=str(cwd) if cwd is not None else None, start_new_session=new_session)
    except FileNotFoundError as exc:
        raise _not_installed(words, exc) from exc


@contextmanager
def spawned(argv: Sequence[Any], **options: Any) -> Iterator[subprocess.Popen]:
    """`start` for the length of a block: if the block fails, the child is killed; it is always reaped."""
    child = start(argv, **options)
    try:
        yield child
    except BaseException:
        stop(child)
        raise
    finally:
        for stream_ in (child.stdin, child.stdout, child.stderr):
            if stream_ is not None:
                try:
                    stream_.close()
                except OSError:
                    pass  # a pipe whose other end is gone
        child.wait()


def stop(child: subprocess.Popen, grace_s: float = 0.0) -> int:
    """End a child (SIGTERM, then SIGKILL after `grace_s`), reap it; its exit code."""
    if child.poll() is None:
        if grace_s > 0:
            child.terminate()
            try:
                return child.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        child.kill()
    return child.wait()


def interactive(argv: Sequence[Any]) -> int:
    """Run `argv` on this terminal (its input, output and signals); its exit code."""
    words = _argv(argv)
    try:
        return subprocess.call(words)
    except FileNotFoundError as exc:
        raise _not_installed(words, exc) from exc


def process_start(pid: int) -> str | None:
    """The kernel's start time of process `pid` (ticks since boot), or None when there is none.

    A pid and its start time name one process: a pid alone may have been given to another since.
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int | None, started: str | None = None) -> bool:
    """Whether process `pid` (started at `started`, when known) still exists on this host."""
    if not pid:
        return False
    now = process_start(int(pid))
    return now is not None and (started is None or now == started)
