"""The commands tflab runs in a node through its guard (guard.pyz, from images/node/tflab_guard), as argv lists.

Built with the guard's own protocol module (tflab_guard.protocol, which the guard parses them
with): its keys, words, grace and lease are defined there once.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from tflab_guard import protocol
from tflab_guard.protocol import Call, Ending

from tflab.engine.attached import OLD_GUARD, End, Reattach
from tflab.engine.executors import Executor
from tflab.errors import TflabError, UserError
from tflab.host.fanout import parallel
from tflab.plan.topology import GRPC_PORT

log = logging.getLogger("tflab.guard")
GUARD = protocol.GUARD
STOP_GRACE_S = protocol.STOP_GRACE_S
run_key, exec_key, serve_key = protocol.run_key, protocol.exec_key, protocol.serve_key


def lease(task: str) -> str:
    """What the `tflab exec`s of TASK hold on the servers they share."""
    return protocol.exec_lease(task)


def run_line(key: str, command: str, held: bool = False, preload: bool = False, warm: bool = False,
             grace_s: float = STOP_GRACE_S, start_id: str | None = None) -> list[str]:
    """The guard's command line that runs the shell line `command` as its own child, attached to tflab
    (stopped by `stop`, or when tflab's lease lapses); `held` waits for `go`. Its streams end with the guard's
    end line (engine/attached.py reads it).

    `warm` hands a Python program to the node's standby interpreter (TensorFlow imported
    already) when there is one; `preload` imports TensorFlow while held when there is not. `start_id` names
    this start, for a probe of it (`await_serving`): an earlier start's ending is not this one's.
    """
    return Call("run", key, wait_for_go=held, preload=preload, warm=warm, grace=float(grace_s), end_in_stream=True,
                id=start_id, shell=command).argv()


def run_argv(key: str, argv: list[str], grace_s: float = STOP_GRACE_S) -> list[str]:
    """The guard's command line that runs `argv` (words, not a shell line) attached to tflab."""
    return Call("run", key, grace=float(grace_s), end_in_stream=True, argv=argv).argv()


def attach(key: str, out_offset: int, err_offset: int) -> list[str]:
    """`key`'s output again from these offsets, and its end line (after a broken or cut-short connection)."""
    return Call("attach", key, out=out_offset, err=err_offset, end_in_stream=True).argv()


def reattach(key: str) -> Reattach:
    """How a connection to `key`'s guard is picked up again, and its output read to its end."""
    return Reattach(partial(attach, key))


def serve(key: str, lease_name: str, command: str, log: str, warm: bool = False) -> list[str]:
    """A server that lives while some holder of `lease_name` lives (output to `log`)."""
    return Call("serve", key, warm=warm, lease=lease_name, log=log, shell=command).argv()


def standby(idle_s: float = 1800.0) -> list[str]:
    """Make the node's standby interpreter (TensorFlow imported, waiting for a --warm program)."""
    return Call("standby", idle=float(idle_s)).argv()


def warm() -> list[str]:
    """Exit WARM_READY while the node's standby is ready, WARM_MAKING while it is being made, WARM_NONE without."""
    return Call("warm").argv()


def serve_detached(key: str, argv: list[str], log: str) -> list[str]:
    """A process that lives until `stop` (TensorBoard), output to `log`."""
    return Call("serve", key, log=log, argv=argv).argv()


def hold(lease_name: str, holder: str) -> list[str]:
    """Hold `lease_name` as `holder` while tflab renews it."""
    return Call("hold", lease_name, holder).argv()


def has_holders(lease_name: str) -> list[str]:
    """Exit 0 while some holder of `lease_name` is renewed."""
    return Call("holders", lease_name).argv()


def probe(node: str, key: str | None, timeout_s: float, quiet_s: float | None = None,
          while_busy: bool = False, start_id: str | None = None) -> list[str]:
    """Exit 0 once node:2222 accepts connections; 3 when `key`'s process (its start `start_id`) ended first; 4 on
    timeout; with
    `quiet_s`, 5 at the timeout when `key`'s processes used the CPU in the last `quiet_s` (busy starting);
    `while_busy`: 4 as soon as they used none for `quiet_s`."""
    return Call("probe", f"{node}:{GRPC_PORT}", timeout=float(timeout_s), key=key, id=start_id,
                quiet=None if quiet_s is None else float(quiet_s), while_busy=while_busy).argv()


# The proxy variables a node's processes may see (gRPC reads the lower-case ones).
PROXY_NAMES = ("grpc_proxy", "https_proxy", "http_proxy", "no_grpc_proxy", "no_proxy", "HTTPS_PROXY", "HTTP_PROXY",
               "NO_PROXY")


def reach(peers: Sequence[str], timeout_s: float = 2.0) -> list[str]:
    """One command for a node: for each peer, whether its TensorFlow port answers from here (`reach PEER CODE`,
    CODE 0 when it does), then the proxy variables the node's processes see (`env NAME=VALUE`)."""
    probes = [f"{shlex.join(probe(peer, None, timeout_s))} >/dev/null 2>&1; echo reach {peer} $?" for peer in peers]
    variables = (f'for v in {" ".join(PROXY_NAMES)}; do eval "x=\\${{$v-}} set=\\${{$v+1}}"; '
                 '[ -z "$set" ] || echo "env $v=$x"; done')
    return ["sh", "-c", "; ".join([*probes, variables])]


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


def alive(key: str) -> list[str]:
    """Exit 0 while `key`'s process lives."""
    return Call("alive", key).argv()


def metrics(every_s: float = 1.0) -> list[str]:
    """The node's metrics, a JSON line every `every_s` seconds, until tflab's connection ends."""
    return Call("metrics", every=float(every_s)).argv()


def ended(key: str) -> list[str]:
    """Print how `key`'s process ended (protocol.Ending as JSON), or `unknown`."""
    return Call("ended", key).argv()


def ending(executor: Executor, node: str, key: str) -> Ending | None:
    """How `key`'s process ended, as its owner recorded it; None where the node cannot say."""
    try:
        code, text = executor.run(node, ended(key))
    except TflabError:
        return None
    return Ending.from_json(text.strip().splitlines()[-1]) if code == 0 and text.strip() else None


def learn_exit(executor: Executor, node: str, key: str, end: End) -> End:
    """The end of `key`'s process as its owner recorded it: the end line's, which the connection brought; where
    that was lost (a connection that broke for good), the node is asked (a second trip)."""
    if end.ending is not None or end.code == 0:
        return end
    found = ending(executor, node, key)
    return end if found is None else End(found.code, end.reason, found)


def stop(patterns: list[str], grace_s: float = STOP_GRACE_S, force: bool = False, forget: bool = False) -> list[str]:
    """Stop every process tflab started under a key that matches one of `patterns` (fnmatch), by its records
    (`forget`: and forget how they ended, before new ones start); an older guard refuses it (the protocol's
    version is asked for), as `check_stopped` says."""
    return Call("stop", *patterns, grace=float(grace_s), force=force, forget=forget, protocol=protocol.VERSION).argv()


def is_old_guard(code: int | None, output: str) -> bool:
    """Whether a guard's answer is an older guard's refusal of what this tflab asked."""
    return code is not None and protocol.is_old_guard(code, output)


def check_stopped(answer: tuple[int, str]) -> None:
    """A stop's answer: an older guard's refusal is a sentence naming the fix."""
    if protocol.is_old_guard(*answer):
        raise UserError(OLD_GUARD)


def warm_up(executor: Executor, names: list[str]) -> None:
    """Make each node's standby interpreter (a no-op where one is there already); never fails a command."""

    def spawn(name: str) -> None:
        try:
            executor.spawn(name, standby())
        except TflabError as exc:
            log.debug("no standby in %s: %s", name, exc)

    parallel(spawn, names, name="standby")


def wait_imported(executor: Executor, node: str, timeout_s: float = 60.0) -> bool:
    """Until `node`'s standby, if one is being made, has imported TensorFlow; whether one was (and now is ready).
    What a `fault cpu` waits for: a standby still importing (made at `up`, or again after a run where one had
    gone) when the node is held to a sliver of a CPU takes minutes (tflab's own preparation, which no cluster has) before the next run starts."""
    deadline = time.monotonic() + timeout_s
    waited = False
    while time.monotonic() < deadline:
        try:
            code, _ = executor.run(node, warm())
        except TflabError:
            return False
        if code != protocol.WARM_MAKING:
            return waited and code == protocol.WARM_READY
        waited = True
        time.sleep(0.5)
    return False
