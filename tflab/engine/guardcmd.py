"""The commands tflab runs in a node through its guard (guard.pyz, from images/node/tflab_guard), as argv lists.

Keys name what tflab started: `run:TASK:NODE` for `tflab run`, `exec:TASK:NODE:ID` for the
process of one `tflab exec`, `serve:TASK:NODE` for servers shared by `tflab exec`s, and the
lease `exec:TASK` those execs hold on them. Task names are words of `[A-Za-z0-9_.-]`, so keys
are safe in paths, and `:` (in no task or node name) keeps `run:train:*` from matching the
keys of `train.v2`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tflab.engine.executors import Executor
from tflab.errors import TflabError
from tflab.host.fanout import parallel
from tflab.plan.tasks import OOM
from tflab.plan.topology import GRPC_PORT

log = logging.getLogger("tflab.guard")
GUARD = ["python3", "/usr/local/share/tflab/guard.pyz"]
STOP_GRACE_S = 3.0


def run_key(task: str, node: str) -> str:
    """The key of a node's process in `tflab run TASK`."""
    return f"run:{task}:{node}"


def exec_key(task: str, node: str, owner: str) -> str:
    """The key of the process one `tflab exec NODE TASK` runs."""
    return f"exec:{task}:{node}:{owner}"


def serve_key(task: str, node: str) -> str:
    """The key of a server that `tflab exec`s of TASK share."""
    return f"serve:{task}:{node}"


def lease(task: str) -> str:
    """What the `tflab exec`s of TASK hold on the servers they share."""
    return f"exec:{task}"


def run_line(key: str, command: str, held: bool = False, preload: bool = False, warm: bool = False,
             grace_s: float = STOP_GRACE_S) -> list[str]:
    """The guard's command line that runs the shell line `command` attached to tflab (stopped when tflab's
    connection ends); `held` waits for `go`.

    `warm` hands a Python program to the node's standby interpreter (TensorFlow imported
    already) when there is one; `preload` imports TensorFlow while held when there is not.
    """
    flags = (["--held"] if held else []) + (["--preload"] if preload else []) + (["--warm"] if warm else [])
    return [*GUARD, "run", key, *flags, "--grace", f"{grace_s:g}", "--shell", command]


def run_argv(key: str, argv: list[str], grace_s: float = STOP_GRACE_S) -> list[str]:
    """The guard's command line that runs `argv` (words, not a shell line) attached to tflab."""
    return [*GUARD, "run", key, "--grace", f"{grace_s:g}", "--", *argv]


def serve(key: str, lease_name: str, command: str, log: str, warm: bool = False) -> list[str]:
    """A server that lives while some holder of `lease_name` lives (output to `log`)."""
    return [*GUARD, "serve", key, *(["--warm"] if warm else []), "--lease", lease_name, "--log", log,
            "--shell", command]


def standby(idle_s: float = 1800.0) -> list[str]:
    """Make the node's standby interpreter (TensorFlow imported, waiting for a --warm program)."""
    return [*GUARD, "standby", "--idle", f"{idle_s:g}"]


def warm() -> list[str]:
    """Exit 0 while the node's standby is ready, 1 while it is being made, 2 when there is none."""
    return [*GUARD, "warm"]


def serve_detached(key: str, argv: list[str], log: str) -> list[str]:
    """A process that lives until `stop` (TensorBoard), output to `log`."""
    return [*GUARD, "serve", key, "--log", log, "--", *argv]


def hold(lease_name: str) -> list[str]:
    """Hold `lease_name` until tflab's connection ends."""
    return [*GUARD, "hold", lease_name]


def held(lease_name: str) -> list[str]:
    """Exit 0 while some holder of `lease_name` lives."""
    return [*GUARD, "held", lease_name]


def probe(node: str, key: str | None, timeout_s: float) -> list[str]:
    """Exit 0 once node:2222 accepts connections; 3 when `key`'s process ended first; 4 on timeout."""
    return [*GUARD, "probe", f"{node}:{GRPC_PORT}", "--timeout", f"{timeout_s:g}",
            *(["--key", key] if key else [])]


def alive(key: str) -> list[str]:
    """Exit 0 while `key`'s process lives."""
    return [*GUARD, "alive", key]


def metrics(every_s: float = 1.0) -> list[str]:
    """The node's metrics, a JSON line every `every_s` seconds, until tflab's connection ends."""
    return [*GUARD, "metrics", "--every", f"{every_s:g}"]


def ended(key: str) -> list[str]:
    """Print how `key`'s process ended: `CODE`, `137 oom` where the kernel's OOM killer ended it, or `unknown`."""
    return [*GUARD, "ended", key]


def end_reason(executor: Executor, node: str, key: str, code: int | None) -> str | None:
    """Why a process that was killed (137) ended, where the node can tell: OOM, the OOM killer's doing."""
    if code != 137:
        return None
    try:
        answer = executor.run(node, ended(key))[1].split()
    except TflabError:
        return None
    return OOM if answer[1:2] == ["oom"] else None


def stop(patterns: list[str], grace_s: float = STOP_GRACE_S, force: bool = False) -> list[str]:
    """Stop every process group whose key matches one of `patterns` (fnmatch)."""
    return [*GUARD, "stop", *patterns, "--grace", f"{grace_s:g}", *(["--force"] if force else [])]


def warm_up(executor: Executor, names: list[str]) -> None:
    """Make each node's standby interpreter (a no-op where one is there already); never fails a command."""

    def spawn(name: str) -> None:
        try:
            executor.spawn(name, standby())
        except TflabError as exc:
            log.debug("no standby in %s: %s", name, exc)

    parallel(spawn, names, name="standby")


NO_STANDBY_AFTER_S = 3.0


def wait_warm(executor: Executor, names: list[str], timeout_s: float = 60.0,
              given_up: Callable[[], bool] = lambda: False) -> bool:
    """Until every node's standby is ready (a run started before would import TensorFlow a second time beside
    it, on the same CPUs); False when one was not ready in `timeout_s`, or `given_up()` says to stop waiting
    (a Ctrl-C)."""
    began = time.monotonic()
    deadline = began + timeout_s
    pending = list(names)
    while pending:
        still = []
        for name in pending:
            if given_up():
                return False
            try:
                code, _ = executor.run(name, warm())
            except TflabError:
                continue  # no node to ask: nothing to wait for
            # 2: none there; a standby just asked for may not have said so yet, so that counts after a moment
            if code == 1 or code == 2 and time.monotonic() - began < NO_STANDBY_AFTER_S or code not in (0, 1, 2):
                still.append(name)
        pending = still
        if not pending or time.monotonic() > deadline or given_up():
            break
        time.sleep(0.3)
    return not pending
