"""Every way of being told to stop becomes one call: SIGINT, SIGTERM, SIGHUP, `tflab stop` and `tflab down`."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

DOWN_REASON = "stopped by `tflab down`"
REASONS: dict[int, str] = {
    signal.SIGINT: "interrupted (Ctrl-C)",
    signal.SIGTERM: "stopped (SIGTERM)",
    signal.SIGHUP: "the terminal closed (SIGHUP)",
    signal.SIGUSR1: "stopped by `tflab stop`",
    signal.SIGUSR2: DOWN_REASON,
}
# A run `tflab down` stops before it removes the lab: recorded `stopped` (it was stopped on purpose), not interrupted.
ON_PURPOSE = (DOWN_REASON,)


@contextmanager
def stop_signals(on_stop: Callable[[str, bool], None]) -> Iterator[None]:
    """While inside, each of these signals calls `on_stop(reason, force)`; a second one forces.

    `on_stop` runs in the main thread between two bytecodes: it may only do what is safe
    there (queue.SimpleQueue.put, or raise to abort a wait).
    """
    received = [0]

    def handler(signum: int, _frame: object) -> None:
        received[0] += 1
        on_stop(REASONS.get(signum, f"signal {signum}"), received[0] > 1)

    previous = {}
    for signum in REASONS:
        try:
            previous[signum] = signal.signal(signum, handler)
        except ValueError:  # not the main thread: nothing to catch here
            pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@contextmanager
def stopping_as_interrupted() -> Iterator[None]:
    """While inside, SIGTERM, SIGHUP and `tflab stop`'s signal end the work as Ctrl-C does (KeyboardInterrupt).

    Python's own end on SIGTERM runs no `finally`: a `tflab base` killed so during its pip step left
    the throwaway container still installing and a temporary tree of gigabytes. Raised instead, the
    cleanups run as they do on a Ctrl-C.
    """
    def interrupt(reason: str, force: bool) -> None:
        raise KeyboardInterrupt(reason)

    with stop_signals(interrupt):
        yield
