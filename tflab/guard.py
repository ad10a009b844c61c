"""The commands tflab runs in a node through its guard (images/node/guard.py), as argv lists.

Keys name what tflab started: `run.TASK.NODE` for `tflab run`, `exec.TASK.NODE.ID` for the
process of one `tflab exec`, `serve.TASK.NODE` for servers shared by `tflab exec`s, and the
lease `exec.TASK` those execs hold on them. Task names are words, so keys are safe in paths.
"""

from __future__ import annotations

from tflab.model import GRPC_PORT

GUARD = ["python3", "/usr/local/share/tflab/guard.py"]
STOP_GRACE_S = 3.0


def run_key(task: str, node: str) -> str:
    """The key of a node's process in `tflab run TASK`."""
    return f"run.{task}.{node}"


def exec_key(task: str, node: str, owner: str) -> str:
    """The key of the process one `tflab exec NODE TASK` runs."""
    return f"exec.{task}.{node}.{owner}"


def serve_key(task: str, node: str) -> str:
    """The key of a server that `tflab exec`s of TASK share."""
    return f"serve.{task}.{node}"


def lease(task: str) -> str:
    """What the `tflab exec`s of TASK hold on the servers they share."""
    return f"exec.{task}"


def run(key: str, command: str, held: bool = False, preload: bool = False, warm: bool = False,
        grace_s: float = STOP_GRACE_S) -> list[str]:
    """Run `command` attached to tflab (stopped when tflab's connection ends); `held` waits for `go`.

    `warm` hands a Python program to the node's standby interpreter (TensorFlow imported
    already) when there is one; `preload` imports TensorFlow while held when there is not.
    """
    flags = (["--held"] if held else []) + (["--preload"] if preload else []) + (["--warm"] if warm else [])
    return [*GUARD, "run", key, *flags, "--grace", f"{grace_s:g}", "--shell", command]


def run_argv(key: str, argv: list[str], grace_s: float = STOP_GRACE_S) -> list[str]:
    """Run an argv list attached to tflab."""
    return [*GUARD, "run", key, "--grace", f"{grace_s:g}", "--", *argv]


def serve(key: str, lease_name: str, command: str, log: str, warm: bool = False) -> list[str]:
    """A server that lives while some holder of `lease_name` lives (output to `log`)."""
    return [*GUARD, "serve", key, *(["--warm"] if warm else []), "--lease", lease_name, "--log", log,
            "--shell", command]


def standby(idle_s: float = 1800.0) -> list[str]:
    """Make the node's standby interpreter (TensorFlow imported, waiting for a --warm program)."""
    return [*GUARD, "standby", "--idle", f"{idle_s:g}"]


def warm() -> list[str]:
    """Exit 0 while the node's standby is ready."""
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


def stop(patterns: list[str], grace_s: float = STOP_GRACE_S, force: bool = False) -> list[str]:
    """Stop every process group whose key matches one of `patterns` (fnmatch)."""
    return [*GUARD, "stop", *patterns, "--grace", f"{grace_s:g}", *(["--force"] if force else [])]
