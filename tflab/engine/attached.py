"""A process in a node attached to tflab through its guard, whatever carries the connection (docker exec, ssh).

The in-node guard reads tflab's connection a line at a time (tflab_guard.protocol): `go`
releases a held process, `stop` stops it (its whole group: TERM, then KILL), `renew` renews
its lease every second. The connection is not its lifeline: when it breaks while the process
runs, tflab attaches again (`resume`) and reads its output on from where it was (the node
keeps it). Its ending comes in the same trip: each of the process's two streams ends with the
guard's end line (protocol.StreamEnd: how it ended, and how many bytes of each stream the node
kept), which tflab answers with what it read (`delivered OUT ERR`), and the node forgets its
copy once that is all of it. A stream that ends without its end line (an engine can close an
exec's stream before the last bytes came through), or before all the node kept came through,
is read on by attaching again, which ends the same way. What stops the process when tflab is
really gone is the lease, which lapses without renewals. Its output is handed to `on_output`
as it comes; `on_exit` is called exactly once, from a `finally`, whatever happens to the
stream. The transports (engine/executors.py) say how to write, read, learn the exit, and
start a connection again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tflab_guard import protocol
from tflab_guard.protocol import EndSplitter, Ending, StreamEnd

from tflab.host.fanout import background

log = logging.getLogger("tflab.executor")
OnOutput = Callable[[bytes, bool], None]  # (chunk, is_stderr)


@dataclass(frozen=True)
class End:
    """How a process ended, as its connection told it: the exit code (None where it is unknown, with why), and the
    guard's own record (protocol.Ending) where its end line came through."""

    code: int | None
    reason: str | None = None
    ending: Ending | None = None


OnExit = Callable[[End], None]


@dataclass(frozen=True)
class Reattach:
    """How to pick a process up again: `argv` attaches to it from the bytes of stdout and stderr read so far.
    `end_line`: its streams end with the guard's end line, so one that ended without it was cut short (and is
    read on); without one (a lease's holder), only a broken connection is picked up again."""

    argv: Callable[[int, int], Sequence[str]]
    end_line: bool = True


GO = (protocol.GO + "\n").encode()
STOP = (protocol.STOP + "\n").encode()
DROP = (protocol.DROP + "\n").encode()
RENEW = (protocol.RENEW + "\n").encode()
RESUMES = 5  # attaching again after a broken connection, at most this many times a process
OLD_GUARD = "this node runs an older tflab guard than this tflab: run `tflab up` to bring the lab's nodes up to date"


class Attached(Protocol):
    """A process started in a node, attached to tflab."""

    def release(self) -> None:
        """Let a held process go on (the servers it needs serve now)."""

    def close(self) -> None:
        """Ask the guard to stop the process's group (TERM, then KILL)."""

    def drop(self) -> None:
        """Its reader is gone (a closed pipe): the guard sends no more of its output, only how it ended."""

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
        self.err_tail = b""  # the last bytes of stderr: an older guard's refusal of what it was asked
        self.resumed = 0
        self.dropping = False  # its reader is gone: the rest of its output is not wanted

    def _say(self, line: bytes) -> None:
        with self._lock:
            if self.ended.is_set():
                return
            try:
                self._write(line)
            except (OSError, ValueError):
                pass  # the process or its node is gone: nothing to tell

    def release(self) -> None:
        self._say(GO)

    def close(self) -> None:
        self.closing = True
        self._say(STOP)  # the connection stays open: the guard's end lines are answered on it

    def drop(self) -> None:
        self.dropping = True
        self._say(DROP)

    def wait(self, timeout: float | None = None) -> bool:
        return self.ended.wait(timeout)

    def _renewing(self) -> None:
        while not self.ended.wait(protocol.RENEW_EVERY_S):
            self._say(RENEW)

    def pump(self, on_output: OnOutput, on_exit: OnExit) -> None:
        reader = _safe(on_output)
        if self.renew:
            background(self._renewing, name="renew")
        end = End(None, "cannot learn how it ended")
        try:
            while True:
                told, lost = self._read_stream(reader)
                if told is not None:  # the guard's end line came through on both streams
                    end = End(told.ending.code, None, told.ending)
                    if told.ending.reason == protocol.OUTSIDE and self._container_stopped():
                        end = End(told.ending.code, "its container stopped", told.ending)
                    if told.kept == self.offsets or self.dropping or self.resume is None or self.resumed >= RESUMES:
                        break
                    again: str | None = "its output ended before all of it came through"
                else:
                    try:
                        code, why = self._exit_status(stream_lost=lost is not None)
                        end = End(code, why or lost)
                    except Exception as exc:  # noqa: BLE001
                        end = End(None, lost or f"cannot learn how it ended ({exc})")
                    if protocol.is_old_guard(end.code, self.err_tail.decode(errors="replace")):
                        end = End(end.code, OLD_GUARD)  # it refused what it was asked: nothing ran
                        break
                    if self.resume is None or self.resumed >= RESUMES or self.closing or (
                            end.code is not None and not self.resume.end_line):
                        break
                    # it ended with no word of how (the stream was cut), or it may still run: attach again
                    again = end.reason or "its output ended before its end line came through"
                if not self._attach_again(again):
                    break
        finally:
            with self._lock:
                try:
                    self._close_ends()
                except Exception:  # noqa: BLE001
                    pass
                self.ended.set()
            on_exit(end)

    def _read_stream(self, reader: OnOutput) -> tuple[StreamEnd | None, str | None]:
        """Read the connection's streams to their end: the guard's end line, when it came on both, and why the
        stream broke, if it did. The end lines are answered with what was read."""
        splitters = (EndSplitter(), EndSplitter())
        answered: list[bool] = []

        def emit(chunk: bytes, is_err: bool) -> None:
            data = splitters[is_err].feed(chunk)
            if data:
                self.offsets[is_err] += len(data)
                if is_err:
                    self.err_tail = (self.err_tail + data)[-2048:]
                reader(data, is_err)
            if splitters[0].end is not None and splitters[1].end is not None and not answered:
                answered.append(True)
                self._say((protocol.delivered_word(*self.offsets) + "\n").encode())

        lost: str | None = None
        try:
            self._stream(emit)
        except Exception as exc:  # noqa: BLE001 - any break of the stream: it may still run
            lost = f"lost the connection to it ({type(exc).__name__}: {exc})"
        for is_err, splitter in enumerate(splitters):
            if splitter.end is None and (rest := splitter.rest()):  # its own bytes after all
                self.offsets[is_err] += len(rest)
                reader(rest, bool(is_err))
        told = splitters[1].end if splitters[0].end is not None else None
        return told, lost

    def _container_stopped(self) -> bool:
        """Whether the process's container is stopping or gone (a kill from outside may be the first sign of it)."""
        return False

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
                if self.dropping:
                    self._write(DROP)  # the new connection's guard wants to know it too
            except Exception as exc:  # noqa: BLE001 - the node itself is gone: the reason stands
                log.info("could not attach again: %s", exc)
                return False
        return True

    def _restart(self, argv: Sequence[str]) -> None:
        raise NotImplementedError

    def _write(self, line: bytes) -> None:
        raise NotImplementedError

    def _stream(self, emit: OnOutput) -> None:
        raise NotImplementedError

    def _exit_status(self, stream_lost: bool) -> tuple[int | None, str | None]:
        raise NotImplementedError

    def _close_ends(self) -> None:
        raise NotImplementedError
