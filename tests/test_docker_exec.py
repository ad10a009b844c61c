"""`tflab exec NODE TASK` on a real lab: the servers it needs, shared between terminals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli
from test_docker_run import task_processes
from tflab import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]


class Terminal:
    """A `tflab exec` as started in a terminal of its own (its own session, so signals reach it alone)."""

    def __init__(self, lab: Path, *args: str) -> None:
        self.child = subprocess.Popen([sys.executable, "-m", "tflab", "exec", "--lab", str(lab), *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
        self.lines: list[str] = []

    def wait_for(self, text: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        assert self.child.stdout is not None
        while time.monotonic() < deadline:
            line = self.child.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"never saw {text!r}; saw:\n{''.join(self.lines[-30:])}")

    def end(self, timeout: float = 60) -> tuple[int, str]:
        rest, _ = self.child.communicate(timeout=timeout)
        return self.child.returncode, "".join(self.lines) + rest


@pytest.fixture
def exec_lab(long_lab: Path) -> Path:
    return long_lab


def test_exec_of_a_task_starts_its_ps_trains_and_stops_it(exec_lab: Path, runner, docker_client) -> None:
    result = runner.invoke(cli, ["exec", "--lab", str(exec_lab), "worker0", "train"])
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]
    accuracy = [line for line in result.stdout.splitlines() if "test accuracy" in line]
    assert accuracy and float(accuracy[-1].split()[-1]) >= 0.9
    assert result.stderr.splitlines()[0] == "tflab: ps0 is serving on ps0:2222 (started for this exec)"
    assert result.stderr.splitlines()[-1] == "tflab: stopped ps0"
    assert task_processes(docker_client, labfiles.open_lab(exec_lab).project) == {}


def test_two_terminals_share_one_ps_and_ctrl_c_stops_only_its_own(exec_lab: Path, docker_client) -> None:
    project = labfiles.open_lab(exec_lab).project
    first = Terminal(exec_lab, "worker0", "long")
    first.wait_for("tflab: ps0 is serving on ps0:2222 (started for this exec)")
    first.wait_for("worker0: first step done")
    second = Terminal(exec_lab, "worker1", "long")
    second.wait_for("tflab: ps0 is serving on ps0:2222 (already serving: this exec joins it)")
    second.wait_for("worker1: first step done")
    running = task_processes(docker_client, project)
    assert sorted(running) == ["ps0", "worker0", "worker1"]
    servers = [p for p in running["ps0"].split("; ") if "guard.py serve serve.long.ps0" in p]
    assert len(servers) == 1, running["ps0"]  # one ps for both
    assert running["ps0"].count("guard.py hold exec.long") == 2  # held by both execs

    second.child.send_signal(signal.SIGINT)  # Ctrl-C in the second terminal
    code, text = second.end()
    assert code == 130, text[-2000:]
    assert "tflab: ps0 keeps serving: another exec of long uses it" in text
    left = task_processes(docker_client, project)
    assert sorted(left) == ["ps0", "worker0"], left  # worker1's training stopped, the rest goes on
    first.wait_for("worker0: global step")

    first.child.send_signal(signal.SIGINT)
    code, text = first.end()
    assert code == 130, text[-2000:]
    assert "tflab: stopped ps0" in text
    assert task_processes(docker_client, project) == {}


def test_exec_of_a_command_keeps_its_exit_code_and_ssh_keeps_quoting(exec_lab: Path, runner) -> None:
    failing = runner.invoke(cli, ["exec", "--lab", str(exec_lab), "worker0", "--", "sh", "-c", "echo out; exit 7"])
    assert (failing.exit_code, failing.stdout) == (7, "out\n")
    quoted = subprocess.run([sys.executable, "-m", "tflab", "ssh", "--lab", str(exec_lab), "worker1", "python", "-c",
                             "print(1 + 1, 'a b')"], capture_output=True, text=True, timeout=60)
    assert quoted.returncode == 0, quoted.stderr
    assert quoted.stdout == "2 a b\n"
