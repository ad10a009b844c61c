"""`tflab exec NODE TASK`: one node runs a task, with the servers it needs started and shared.

The first exec of a task starts the task's servers (the ps) and waits until they accept;
later execs of the same task, from other terminals, join them. Each exec holds a lease
on the servers; they are stopped when the last exec using them ends (and they stop by
themselves within a second if every holder dies). A Ctrl-C stops only what its own exec
owns: its node's process, and the servers if no other exec still uses them.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tflab import guard
from tflab.errors import Interrupted, TflabError, UserError
from tflab.executor import Attached, Executor, Output
from tflab.model import GRPC_PORT
from tflab.launcher import warm_up
from tflab.threads import parallel


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between tflab processes on this host (released when the process dies)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class ExecSetup:
    """What one exec runs."""

    task: str
    node: str
    servers: tuple[str, ...]
    commands: Mapping[str, str]
    env: Mapping[str, str]
    lock: Path
    warm: bool = True
    ready_timeout_s: float = 120.0
    stop_grace_s: float = guard.STOP_GRACE_S


class ExecSession:
    """Runs `setup.node`'s task to its end; its exit code is the node process's."""

    def __init__(self, executor: Executor, setup: ExecSetup, on_output: Output,
                 say: Callable[[str], None]) -> None:
        self.executor = executor
        self.setup = setup
        self.on_output = on_output
        self.say = say
        self.owner = str(os.getpid())
        self.events: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.holders: dict[str, Attached] = {}
        self.node_started = False

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop this exec (called from a signal handler).

        While the servers start, it raises (the holders and started servers are released
        on the way out); once the node's process runs, that process is stopped first.
        """
        if not self.node_started:
            raise Interrupted(reason)
        self.events.put(("interrupt", (reason, force)))

    def run(self) -> int:
        setup = self.setup
        try:
            if setup.servers:
                with file_lock(setup.lock):
                    self._hold_and_start_servers()
            return self._run_node()
        finally:
            if setup.servers:
                with file_lock(setup.lock):
                    self._release_servers()
            if setup.warm:
                warm_up(self.executor, [setup.node, *setup.servers])

    # -- the servers -----------------------------------------------------------------------

    def _hold_and_start_servers(self) -> None:
        setup = self.setup
        lease = guard.lease(setup.task)
        ignore: Output = lambda _chunk, _is_err: None  # noqa: E731
        for name in setup.servers:
            self.holders[name] = self.executor.start(name, guard.hold(lease), ignore,
                                                     lambda _code, _why: None, workdir="/")

        def start(name: str) -> bool:
            key = guard.serve_key(setup.task, name)
            if self.executor.run(name, guard.alive(key))[0] == 0:
                return False
            self.executor.run(name, guard.stop([key], force=True))  # clear a dead one's traces
            log = f"/runs/{setup.task}/logs/{name}.log"
            self.executor.spawn(name, guard.serve(key, lease, setup.commands[name], log, warm=setup.warm),
                                env=setup.env, workdir="/workspace")
            return True

        started = dict(zip(setup.servers, parallel(start, setup.servers)))
        probes = dict(zip(setup.servers, parallel(
            lambda name: self.executor.run(name, guard.probe(name, guard.serve_key(setup.task, name),
                                                             setup.ready_timeout_s))[0],
            setup.servers)))
        for name in setup.servers:
            if probes[name] == 3:
                raise UserError(f"{name} exited before serving on port {GRPC_PORT}; its output is in "
                                f"the runs folder: {setup.task}/logs/{name}.log")
            if probes[name] != 0:
                raise UserError(f"{name} did not serve on port {GRPC_PORT} within {setup.ready_timeout_s:g}s; "
                                f"its output is in the runs folder: {setup.task}/logs/{name}.log")
            how = "started for this exec" if started[name] else "already serving: this exec joins it"
            self.say(f"{name} is serving on {name}:{GRPC_PORT} ({how})")

    def _release_servers(self) -> None:
        setup = self.setup
        for holder in self.holders.values():
            holder.close()
        for holder in self.holders.values():
            holder.wait(5)
        for name in self.holders:
            try:
                if self.executor.run(name, guard.held(guard.lease(setup.task)))[0] == 0:
                    self.say(f"{name} keeps serving: another exec of {setup.task} uses it")
                    continue
                self.executor.run(name, guard.stop([guard.serve_key(setup.task, name)], setup.stop_grace_s))
            except TflabError:
                continue  # the node is gone; its server went with it
            self.say(f"stopped {name}")

    # -- the node's own process --------------------------------------------------------------

    def _run_node(self) -> int:
        setup = self.setup
        key = guard.exec_key(setup.task, setup.node, self.owner)
        argv = guard.run(key, setup.commands[setup.node], warm=setup.warm, grace_s=setup.stop_grace_s)

        def on_exit(code: int | None, reason: str | None) -> None:
            self.events.put(("exit", (code, reason)))

        self.node_started = True  # from here on an interrupt is queued, and handled below
        process = self.executor.start(setup.node, argv, self.on_output, on_exit, env=setup.env)
        interrupted: str | None = None
        while True:
            kind, value = self.events.get()
            if kind == "exit":
                code, reason = value  # type: ignore[misc]
                break
            reason_text, force = value  # type: ignore[misc]
            interrupted = interrupted or str(reason_text)
            if force:
                threading.Thread(target=self.executor.run, args=(setup.node, guard.stop([key], force=True)),
                                 daemon=True).start()
            process.close()  # the guard stops the process group: TERM, then KILL
        if interrupted:
            self.say(f"{interrupted}: stopped {setup.node}'s {setup.task}")
            return 130
        if code is None:
            self.say(f"{setup.node}'s {setup.task} ended with no exit code: {reason}")
            return 255
        return code
