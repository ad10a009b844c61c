"""What the real guard answers, for the host-side tests' fake nodes: held to the real guard.pyz by
tests/test_guard.py::test_the_fakes_answer_ended_as_the_real_guard_does (its end line too) and
test_the_fakes_answer_probe_as_the_real_guard_does, and test_the_fakes_answer_stack_as_the_real_guard_does."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tflab_guard.protocol import (PROBE_BUSY, PROBE_SERVING, PROBE_TIMEOUT, STACK_DUMPED, STACK_NOTHING, Ending,
                                  busy_reply)

from tflab.engine.attached import End


def end(code: int | None, stopped: bool) -> End:
    """What a connection tells of a program that exited with `code`, or that tflab stopped: the guard's end line
    (a program whose end is unknown, `code` None, has none)."""
    if stopped:
        return End(143, None, Ending(143, "SIGTERM", "stopped"))
    return End(None) if code is None else End(code, None, Ending(code))


def ended(code: int | None, stopped: bool) -> tuple[int, str]:
    """The guard's `ended KEY` (exit code, output) for a program that exited with `code`, or that tflab stopped."""
    if stopped:
        return 0, Ending(143, "SIGTERM", "stopped").to_json() + "\n"
    if code is None:
        return 1, "unknown\n"
    return 0, Ending(code).to_json() + "\n"


def probe(argv: list[str], serves_at: float | None, busy: bool, now: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> tuple[int, str]:
    """The guard's `probe` (exit code, output) for a server that accepts from `serves_at` (a time of `now`; None:
    never), whose processes use the CPU until then (`busy`) or sleep; as long as the real one takes."""
    timeout = float(argv[argv.index("--timeout") + 1])
    quiet = float(argv[argv.index("--quiet") + 1]) if "--quiet" in argv else None
    if serves_at is not None and serves_at <= now() + timeout:
        sleep(max(0.0, serves_at - now()))
        return PROBE_SERVING, ""
    if "--while-busy" in argv and not busy and quiet is not None:
        sleep(min(quiet, timeout))  # stuck: said once it used no CPU for --quiet seconds
        return PROBE_TIMEOUT, ""
    sleep(timeout)
    if busy and quiet is not None and "--key" in argv:
        return PROBE_BUSY, busy_reply(timeout) + "\n"  # it used a whole CPU all along
    return PROBE_TIMEOUT, ""


STACKS = Path(__file__).parent / "fixtures" / "stacks"  # real dumps (py-spy 0.4, TensorFlow 2.21), and their programs


def stack(dump: str | None) -> tuple[int, str]:
    """The guard's `stack KEY` (exit code, output) for a process whose stacks are the real dump `dump` (a file of
    tests/fixtures/stacks: server_join, tf1_session_wait, own_retry_loop), or for no live process (None)."""
    if dump is None:
        return STACK_NOTHING, ""
    return STACK_DUMPED, (STACKS / f"{dump}.txt").read_text()
