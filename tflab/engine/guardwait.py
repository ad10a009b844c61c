"""Asking a node's guard and waiting on its answers: a server that serves (or ended first, or is stuck), an ending
asked for where its end line was lost, a stop an older guard refused.

The commands are guardcmd's; the words of the answers are the protocol's (tflab_guard.protocol);
the sentences a user reads of them are here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from tflab_guard import protocol
from tflab_guard.protocol import Ending

from tflab.engine.attached import OLD_GUARD, End
from tflab.engine.executors import Executor
from tflab.engine.guardcmd import ended, probe, stack
from tflab.errors import TflabError, UserError
from tflab.host.fanout import parallel
from tflab.plan.topology import GRPC_PORT

log = logging.getLogger("tflab.guard")


# How long one probe of a server busy starting lasts (it ends sooner once the server serves, ended, or stopped
# using the CPU): each is a new interpreter in the server's node, whose CPU may be a sliver.
BUSY_PROBE_S = 300.0


class ServeOutcome(StrEnum):
    """How the wait for a server ended."""

    SERVING = "serving"
    ENDED = "ended"  # its process ended first
    LATE = "late"  # it did not serve: the ServeWait's problem says why, where that is known


@dataclass(frozen=True)
class ServeWait:
    """How the wait for a server ended: `serving`, `ended` (its process ended first), or `late` (with the
    sentence: it did not serve, and why that is known)."""

    outcome: ServeOutcome
    problem: str | None = None


def await_serving(executor: Executor, node: str, key: str | None, timeout_s: float,
                  on_busy: Callable[[str], None], quiet_s: float = protocol.SERVE_QUIET_S,
                  start_id: str | None = None) -> ServeWait:
    """Wait for `node`'s server (`key`'s process) to accept on its port, `timeout_s`, and past it for as long
    as its processes use the CPU: a server in a node held to a sliver of a CPU takes minutes to import
    TensorFlow, and a cluster's workers wait for it as long as that takes (a `--timeout` of the run still
    ends the wait). Once, when it is past `timeout_s` and busy, `on_busy` gets a sentence saying so.
    Without a `key` (another terminal's server) its processes are not known: `timeout_s` is the wait. With
    `start_id` (run_line's), only that start's ending is an end: the node may still hold an earlier one's record
    until the new start's guard begins."""
    began = time.monotonic()
    code, out = executor.run(node, probe(node, key, timeout_s, quiet_s if key else None, start_id=start_id))
    said = False
    while code == protocol.PROBE_BUSY:
        if not said:
            on_busy(f"{node} has not served on port {GRPC_PORT} within {timeout_s:g}s, but it is busy starting "
                    f"({protocol.read_busy(out):.1f} CPU-s in that time): waiting while it uses the CPU")
            said = True
        code, out = executor.run(node, probe(node, key, BUSY_PROBE_S, quiet_s, while_busy=True, start_id=start_id))
    if code == protocol.PROBE_SERVING:
        return ServeWait(ServeOutcome.SERVING)
    if code == protocol.PROBE_ENDED:
        return ServeWait(ServeOutcome.ENDED)
    if protocol.is_old_guard(code, out):
        return ServeWait(ServeOutcome.LATE, OLD_GUARD)
    if code != protocol.PROBE_TIMEOUT:
        return ServeWait(ServeOutcome.LATE, f"{node} could not be asked whether it serves (exit {code}: {out.strip()[-200:]})")
    if not key:
        return ServeWait(ServeOutcome.LATE, f"{node} did not serve on port {GRPC_PORT} within {timeout_s:g}s")
    if not said:
        return ServeWait(ServeOutcome.LATE, f"{node} did not serve on port {GRPC_PORT} within {timeout_s:g}s, and its "
                                 f"processes used no CPU in the last {min(quiet_s, timeout_s):g}s: it is stuck")
    return ServeWait(ServeOutcome.LATE, f"{node} did not serve on port {GRPC_PORT}: busy starting for a while, it then used no "
                             f"CPU for {quiet_s:g}s ({time.monotonic() - began:.0f}s after it was started): it is stuck")


def ending(executor: Executor, node: str, key: str) -> Ending | None:
    """How `key`'s process ended, as its owner recorded it; None where the node cannot say."""
    try:
        code, text = executor.run(node, ended(key))
    except TflabError:
        return None
    return Ending.from_answer(code, text)


def learn_exit(executor: Executor, node: str, key: str, end: End) -> End:
    """The end of `key`'s process as its owner recorded it: the end line's, which the connection brought; where
    that was lost (a connection that broke for good), the node is asked (a second trip)."""
    if end.ending is not None or end.code == 0:
        return end
    found = ending(executor, node, key)
    return end if found is None else End(found.code, end.reason, found)


def is_old_guard(code: int | None, output: str) -> bool:
    """Whether a guard's answer is an older guard's refusal of what this tflab asked."""
    return code is not None and protocol.is_old_guard(code, output)


def check_stopped(answer: tuple[int, str]) -> None:
    """A stop's answer: an older guard's refusal is a sentence naming the fix."""
    if protocol.is_old_guard(*answer):
        raise UserError(OLD_GUARD)


def stack_of(executor: Executor, node: str, key: str) -> tuple[str | None, str | None]:
    """Where `key`'s processes in `node` wait: (py-spy's dump of their threads, None), or (None, why not)."""
    try:
        code, output = executor.run(node, stack(key))
    except TflabError as exc:
        return None, f"{node} could not be asked ({exc})"
    if code == protocol.STACK_DUMPED:
        return output, None
    if code == protocol.STACK_NOTHING:
        return None, "its process had ended"
    if protocol.is_old_guard(code, output):
        return None, OLD_GUARD
    lines = [line for line in output.splitlines() if line.strip()]
    return None, lines[-1].removeprefix("tflab: ") if lines else f"py-spy could not read it (exit {code})"
