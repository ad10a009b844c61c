"""The commands tflab runs in a node through its guard (guard.pyz, from images/node/tflab_guard), as argv lists.

Built with the guard's own protocol module (tflab_guard.protocol, which the guard parses them
with): its keys, words, grace and lease are defined there once. Nothing here runs them: what
asks a guard and waits on its answers (a server serving, an ending asked for, a stop refused) is engine/guardwait.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from functools import partial

from tflab_guard import protocol
from tflab_guard.protocol import Call

from tflab.engine.attached import Reattach
from tflab.plan.topology import GRPC_PORT


def run_line(key: str, command: str, held: bool = False, grace_s: float = protocol.STOP_GRACE_S,
             start_id: str | None = None) -> list[str]:
    """The guard's command line that runs the shell line `command` as its own child, attached to tflab
    (stopped by `stop`, or when tflab's lease lapses); `held` waits for `go`. Its streams end with the guard's
    end line (engine/attached.py reads it). The program starts cold, as on a cluster's machine. `start_id` names
    this start, for a probe of it (`await_serving`): an earlier start's ending is not this one's.
    """
    return Call("run", key, wait_for_go=held, grace=float(grace_s), end_in_stream=True, id=start_id,
                shell=command).argv()


def run_argv(key: str, argv: list[str], grace_s: float = protocol.STOP_GRACE_S) -> list[str]:
    """The guard's command line that runs `argv` (words, not a shell line) attached to tflab."""
    return Call("run", key, grace=float(grace_s), end_in_stream=True, argv=argv).argv()


def attach(key: str, out_offset: int, err_offset: int) -> list[str]:
    """`key`'s output again from these offsets, and its end line (after a broken or cut-short connection)."""
    return Call("attach", key, out=out_offset, err=err_offset, end_in_stream=True).argv()


def reattach(key: str) -> Reattach:
    """How a connection to `key`'s guard is picked up again, and its output read to its end."""
    return Reattach(partial(attach, key))


def serve(key: str, lease_name: str, command: str, log: str) -> list[str]:
    """A server that lives while some holder of `lease_name` lives (output to `log`)."""
    return Call("serve", key, lease=lease_name, log=log, shell=command).argv()


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


def stack(key: str) -> list[str]:
    """Print the Python stack of every thread of `key`'s processes (py-spy's dump); exit protocol.STACK_*."""
    return Call("stack", key).argv()


def alive(key: str) -> list[str]:
    """Exit 0 while `key`'s process lives."""
    return Call("alive", key).argv()


def metrics(every_s: float = 1.0) -> list[str]:
    """The node's metrics, a JSON line every `every_s` seconds, until tflab's connection ends."""
    return Call("metrics", every=float(every_s)).argv()


def ended(key: str) -> list[str]:
    """Print how `key`'s process ended (protocol.Ending as JSON), or `unknown`."""
    return Call("ended", key).argv()


def stop(patterns: list[str], grace_s: float = protocol.STOP_GRACE_S, force: bool = False, forget: bool = False) -> list[str]:
    """Stop every process tflab started under a key that matches one of `patterns` (fnmatch), by its records
    (`forget`: and forget how they ended, before new ones start); an older guard refuses it (the protocol's
    version is asked for), as `check_stopped` says."""
    return Call("stop", *patterns, grace=float(grace_s), force=force, forget=forget, protocol=protocol.VERSION).argv()
