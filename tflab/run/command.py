"""`tflab exec NODE -- CMD`: any command in a node, attached through the guard, supervised as a run's lone worker.

The command's end, a Ctrl-C (a second one forces) and a closed stdout reach the run's state
machine as events through the one supervision loop (run/drive.py); its verdict is the
machine's: the command's exit code, 130 when interrupted, 255 when its code is unknown.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Sequence

from tflab_guard import protocol

from tflab.engine import guardcmd
from tflab.engine.executors import Executor, OnOutput
from tflab.run.drive import drive
from tflab.run.events import Action, Began, Event, Finish, Interrupt, Stop
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan
from tflab.run.watch import ProcessWatch


class CommandRun:
    """One command in one node, to its end."""

    def __init__(self, executor: Executor, node: str, argv: Sequence[str], on_output: OnOutput,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.node = node
        self.argv = list(argv)
        self.on_output = on_output
        self.clock = clock
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.dropped = False

    def output_closed(self) -> None:
        """Its reader is gone (`| head -1`): the command is stopped, as a closed pipe ends a program, and the rest of
        its output is not sent (a `yes` writes more in a second than a stream carries in a minute)."""
        self.dropped = True
        self.interrupt("its output was closed")

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop the command in the node (safe in a signal handler); `force` kills it at once."""
        self.events.put(Interrupt(self.clock(), reason, force))

    def run(self) -> Finish:
        node = self.node
        machine = RunMachine(RunPlan(servers=(), finishers=(node,), chief=node, stop_hung=False))
        key = protocol.exec_key("cmd", node, str(os.getpid()))
        first = machine.handle(Began(self.clock()))
        watch = ProcessWatch(node, key, self.executor, self.events, self.clock)

        def on_output(chunk: bytes, is_err: bool) -> None:
            watch.output(chunk, is_err)
            self.on_output(chunk, is_err)

        process = self.executor.start(node, guardcmd.run_argv(key, self.argv), on_output, watch.exited, renew=True,
                                      resume=guardcmd.reattach(key))

        def carry_out(actions: list[Action]) -> None:
            for action in actions:  # its start is the process started above
                if isinstance(action, Stop):
                    if self.dropped:
                        process.drop()
                    process.close()  # the guard stops the command's process group: TERM, then KILL

        carry_out(first)
        drive(machine, self.events, carry_out, self.clock)
        return machine.verdict_of(node)
