"""A process in a node attached to tflab through its guard, whatever carries the connection (docker exec, ssh).

The in-node guard reads tflab's connection a line at a time (tflab_guard.protocol): `go`
releases a held process, `stop` stops it (its whole group: TERM, then KILL), `renew` renews
its lease every second. The connection is not its lifeline: when it breaks while the process
runs, tflab attaches again (`resume`) and reads its output on from where it was (the node
keeps it). A stream that ends is not taken for all of the output either: once the process
has ended, the node is asked whether it holds more than was read (an engine can close an
exec's stream before the last bytes came through), and the rest is read by attaching again.
What stops the process when tflab is really gone is the lease, which lapses without
renewals. Its output is handed to `on_output` as it comes; `on_exit` is called exactly once,
from a `finally`, whatever happens to the stream. The transports (engine/executors.py) say
how to write, read, learn the exit, and start a connection again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tflab_guard import protocol

from tflab.host.fanout import background

log = logging.getLogger("tflab.executor")
OnOutput = Callable[[bytes, bool], None]  # (chunk, is_stderr)
OnExit = Callable[[int | None, str | None], None]  # (exit code or None, why it is unknown)


@dataclass(frozen=True)
class Reattach:
    """How to pick a process up again: `argv` attaches to it from the bytes of stdout and stderr read so far;
    `all_read` says whether those are all of its output the node kept (once it has ended)."""

    argv: Callable[[int, int], Sequence[str]]
    all_read: Callable[[int, int], bool] = lambda _out, _err: True


GO = (protocol.GO + "\n").encode()
STOP = (protocol.STOP + "\n").encode()
RENEW = (protocol.RENEW + "\n").encode()
RESUMES = 5  # attaching again after a broken connection, at most this many times a process


class Attached(Protocol):
    """A process started in a node, attached to tflab."""

    def release(self) -> None:
        """Let a held process go on (the servers it needs serve now)."""

    def close(self) -> None:
        """Ask the guard to stop the process's group (TERM, then KILL)."""

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until its output has ended; whether it has."""


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


class GuardedProcess:
    """A process in a node whose guard reads tflab's connection: `go` releases it, `stop` stops it.

    `pump` reads its output to the end, then learns how it ended and calls `on_exit` once, from a
    `finally`. The two kinds differ in how they write to the guard (`_write`), read the output
    (`_stream`), learn the exit (`_exit_status`) and close the connection (`_close_ends`).
    """

    def __init__(self, renew: bool = False, resume: Reattach | None = None) -> None:
        self.ended = threading.Event()
        self.closing = False
        self._lock = threading.Lock()
        self.renew = renew
        self.resume = resume
        self.offsets = [0, 0]  # bytes of stdout and stderr read so far
        self.resumed = 0

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

    def _renewing(self) -> None:
        while not self.ended.wait(protocol.RENEW_EVERY_S):
            self._say(RENEW)

    def pump(self, on_output: OnOutput, on_exit: OnExit) -> None:
        reader = _safe(on_output)

        def emit(chunk: bytes, is_err: bool) -> None:
            self.offsets[is_err] += len(chunk)
            reader(chunk, is_err)

        if self.renew:
            background(self._renewing, name="renew")
        code: int | None = None
        reason: str | None = None
        try:
            while True:
                lost: str | None = None
                try:
                    self._stream(emit)
                except Exception as exc:  # noqa: BLE001 - any break of the stream: it may still run
                    lost = f"lost the connection to it ({type(exc).__name__}: {exc})"
                reason = lost
                try:
                    code, why = self._exit_status(stream_lost=lost is not None)
                    reason = why or reason
                except Exception as exc:  # noqa: BLE001
                    code, reason = None, reason or f"cannot learn how it ended ({exc})"
                if self.resume is None or self.resumed >= RESUMES:
                    break
                again: str | None = reason
                if code is not None:  # it ended: read to its end only if the node holds no more of its output
                    if self._all_read():
                        break
                    again = "its output ended before all of it came through"
                elif self.closing:
                    break
                if not self._attach_again(again):
                    break
        finally:
            with self._lock:
                try:
                    self._close_ends()
                except Exception:  # noqa: BLE001
                    pass
                self.ended.set()
            on_exit(code, reason)

    def _all_read(self) -> bool:
        assert self.resume is not None
        try:
            return self.resume.all_read(*self.offsets)
        except Exception:  # noqa: BLE001 - a node that cannot say has nothing more to give
            log.debug("could not ask whether all output was read", exc_info=True)
            return True

    def _attach_again(self, why: str | None) -> bool:
        """The connection broke while the process may run: attach to it again, from the output read so far."""
        assert self.resume is not None
        self.resumed += 1
        log.info("attaching again (%s): %s", self.resumed, why)
        time.sleep(min(self.resumed - 1, 2))
        with self._lock:
            try:
                self._close_ends()
            except Exception:  # noqa: BLE001
                pass
            try:
                self._restart(self.resume.argv(*self.offsets))
            except Exception as exc:  # noqa: BLE001 - the node itself is gone: the reason stands
                log.info("could not attach again: %s", exc)
                return False
        return True

    def _restart(self, argv: Sequence[str]) -> None:
        raise NotImplementedError

    def _write(self, line: bytes, last: bool) -> None:
        raise NotImplementedError

    def _stream(self, emit: OnOutput) -> None:
        raise NotImplementedError

    def _exit_status(self, stream_lost: bool) -> tuple[int | None, str | None]:
        raise NotImplementedError

    def _close_ends(self) -> None:
        raise NotImplementedError
