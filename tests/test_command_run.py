"""`tflab exec NODE -- CMD` through the one supervision loop, with a fake node: exit codes, Ctrl-C, no exit code."""

from __future__ import annotations

import threading
import time

import fakeguard
from test_exec_session import FakeProcess

from tflab.run.command import CommandRun


class OneNode:
    """A node whose command prints `lines` and exits with `code` after `delay` (143 once closed)."""

    def __init__(self, lines: list[str], code: int | None, delay: float) -> None:
        self.program = (lines, code, delay)
        self.argv: list[str] = []

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        self.argv = list(argv)
        self.process = FakeProcess(*self.program, on_output, on_exit)
        return self.process

    def run(self, node, argv, env=None, workdir="/"):
        assert argv[2] == "ended", argv  # the only thing a command's run asks of its node
        while not hasattr(self, "process"):  # asked from the process's own thread, as it ends at once
            time.sleep(0.001)
        return fakeguard.ended(self.process.code, self.process.closed.is_set())


def run(node: OneNode, interrupt_after: float | None = None) -> tuple:
    printed: list[bytes] = []
    command = CommandRun(node, "worker0", ["sh", "-c", "exit 7"], lambda chunk, _err: printed.append(chunk))
    if interrupt_after is not None:
        threading.Timer(interrupt_after, command.interrupt, args=("interrupted (Ctrl-C)",)).start()
    return command.run(), b"".join(printed).decode()


def test_the_commands_own_exit_code_and_output() -> None:
    finish, printed = run(OneNode(["out"], 7, 0.0))
    assert (finish.exit_code, finish.verdict) == (7, "failed") and printed == "out\n"
    finish, _ = run(OneNode([], 0, 0.0))
    assert (finish.exit_code, finish.verdict, finish.problem) == (0, "ok", None)


def test_a_ctrl_c_stops_the_command_in_the_node_and_exits_130() -> None:
    node = OneNode([], 0, 30.0)
    finish, _ = run(node, interrupt_after=0.3)
    assert node.process.closed.is_set(), "the command in the node was told to stop"
    assert (finish.exit_code, finish.verdict) == (130, "interrupted")


def test_a_command_whose_code_is_unknown_says_why_and_exits_255() -> None:
    finish, _ = run(OneNode([], None, 0.0))
    assert finish.exit_code == 255 and finish.verdict == "failed"
    assert finish.problem is not None and "worker0" in finish.problem and "no exit code" in finish.problem
