"""`tflab exec NODE TASK` on a real lab: the servers it needs, shared between terminals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli, killed_after
from test_docker_run import add_tasks, task_processes

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]


class Terminal:
    """A `tflab exec` as started in a terminal of its own (its own session, so signals reach it alone)."""

    def __init__(self, lab: Path, *args: str) -> None:
        self.child = subprocess.Popen([sys.executable, "-m", "tflab", "exec", "--lab", str(lab), *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)
        self.lines: list[str] = []

    def wait_for(self, text: str, timeout: float = 180) -> str:
        """The line holding `text`; the exec is killed, and the test fails, once `timeout` passed."""
        assert self.child.stdout is not None
        with killed_after(self.child, timeout):
            for line in iter(self.child.stdout.readline, ""):
                self.lines.append(line)
                if text in line:
                    return line
        raise AssertionError(f"never saw {text!r} within {timeout:.0f} s; saw:\n{''.join(self.lines[-30:])}")

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
    said = result.stderr.splitlines()
    assert said[0] == f"tflab: train: a fresh session, outputs in {exec_lab / 'runs' / 'train'}"
    assert said[1] == "tflab: ps0 is serving on ps0:2222 (started for this exec)"
    assert said[-2] == "tflab: stopped ps0"
    assert said[-1].startswith("tflab: worker0's train: ok (exit 0, ") and " steps/s, " in said[-1]
    assert "accuracy 0.9" in said[-1] or "accuracy 1" in said[-1], "its quality, as a run's summary says it"
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
    servers = [p for p in running["ps0"].split("; ") if "tflab-guard serve serve:long:ps0" in p]
    assert len(servers) == 1, running["ps0"]  # one ps for both
    assert running["ps0"].count("guard.pyz hold exec:long") == 2  # held by both execs

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
    line = subprocess.run([sys.executable, "-m", "tflab", "ssh", "--lab", str(exec_lab), "worker1",
                           "echo $TFLAB_NODE; nproc"], capture_output=True, text=True, timeout=60)
    assert line.returncode == 0, line.stderr
    assert line.stdout.splitlines()[0] == "worker1" and line.stdout.splitlines()[1].isdigit(), \
        "one word is a command line for the node's shell, as ssh runs it"


SHORT = ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
         "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=400")


def test_two_terminals_the_seeds_way_six_times_in_a_row(exec_lab: Path, docker_client) -> None:
    """exec worker0 once; then worker0 and, 2 s later, worker1, six times (it hung forever before)."""
    add_tasks(exec_lab, {"short": SHORT})
    first = Terminal(exec_lab, "worker0", "short")
    code, text = first.end(timeout=240)
    assert code == 0, text[-3000:]
    for round_ in range(6):
        chief = Terminal(exec_lab, "worker0", "short")
        time.sleep(2)
        worker = Terminal(exec_lab, "worker1", "short")
        (chief_code, chief_text), (worker_code, worker_text) = chief.end(timeout=240), worker.end(timeout=240)
        assert (chief_code, worker_code) == (0, 0), f"round {round_}:\n{chief_text[-2000:]}\n{worker_text[-2000:]}"
        assert "worker0: resuming from" not in chief_text, "each session starts fresh"
        assert "tflab: ps0 is serving on ps0:2222 (already serving: this exec joins it)" in worker_text
        assert "worker1: done after" in worker_text and "tflab: worker1's short: ok (exit 0," in worker_text
        # Whichever ended first left ps0 to the other; the last one stopped it.
        assert sorted([chief_text.count("tflab: stopped ps0"), worker_text.count("tflab: stopped ps0")]) == [0, 1]
    assert task_processes(docker_client, labfiles.open_lab(exec_lab).project) == {}


def test_a_ps_exec_in_its_own_terminal_is_joined_and_a_closed_pipe_ends_an_exec(exec_lab: Path,
                                                                              docker_client) -> None:
    """Issue 30.3: `exec ps0 T`, then the workers' execs: one ps0 (a second died on its port before)."""
    add_tasks(exec_lab, {"short": SHORT})
    project = labfiles.open_lab(exec_lab).project
    ps = Terminal(exec_lab, "ps0", "short")
    ps.wait_for("ps0: serving the model's variables on ps0:2222")
    chief = Terminal(exec_lab, "worker0", "short")
    worker = Terminal(exec_lab, "worker1", "short")
    (chief_code, chief_text), (worker_code, worker_text) = chief.end(timeout=240), worker.end(timeout=240)
    assert (chief_code, worker_code) == (0, 0), f"{chief_text[-2000:]}\n{worker_text[-2000:]}"
    joined = "tflab: ps0 is serving on ps0:2222 (its own exec, in another terminal: this exec joins it)"
    assert joined in chief_text and joined in worker_text
    assert "stopped ps0" not in chief_text + worker_text, "ps0's own exec ends it"
    log = (exec_lab / "runs" / "short" / "logs" / "ps0.log").read_text()
    assert "serving the model's variables" in log and "Address already in use" not in log, log[-2000:]
    ps.child.send_signal(signal.SIGINT)
    code, text = ps.end()
    assert code == 130, text[-2000:]
    assert task_processes(docker_client, project) == {}

    # `| head -1` closes tflab's stdout: the command in the node ends too, and so does tflab
    piped = subprocess.run(f"{sys.executable} -m tflab exec --lab {exec_lab} worker0 -- yes | head -1",
                           shell=True, capture_output=True, text=True, timeout=60)
    assert piped.stdout == "y\n", piped.stderr[-2000:]
    assert task_processes(docker_client, project) == {}


HANGS = """import os, sys, time
print("step 1", flush=True)
if os.environ["TFLAB_NODE"] == "worker0":
    sys.exit(0)  # the chief is done
time.sleep(3600)  # a worker that never ends: waiting for something that will not come
"""


@pytest.mark.alone  # timed: stopped within the 5 s grace and 10 s
def test_a_worker_exec_that_hangs_after_the_chief_is_told_and_stopped_within_the_grace(exec_lab: Path, runner,
                                                                                       docker_client) -> None:
    (exec_lab / "code" / "hangs.py").write_text(HANGS)
    add_tasks(exec_lab, {"hangs": {"command": "python /workspace/hangs.py", "servers": []}})
    assert runner.invoke(cli, ["up", "--lab", str(exec_lab)]).exit_code == 0
    worker = Terminal(exec_lab, "--grace", "5", "worker1", "hangs")
    worker.wait_for("tflab: worker1 trains with the chief, worker0, which no exec runs yet")
    worker.wait_for("step 1")
    chief = subprocess.run([sys.executable, "-m", "tflab", "exec", "--lab", str(exec_lab), "worker0", "hangs"],
                           capture_output=True, text=True, timeout=120)
    assert chief.returncode == 0, chief.stderr
    chief_ended = time.monotonic()
    worker.wait_for("tflab: the chief (worker0) has finished", timeout=15)
    said = worker.wait_for("reported hung and stopped", timeout=5 + 10)
    assert time.monotonic() - chief_ended <= 5 + 10
    assert said.startswith("tflab: worker1's hangs: hung (exit 1, ")
    assert "worker1 still running 5s after the chief finished, silent for" in said
    code, _text = worker.end(timeout=30)
    assert code == 1
    assert task_processes(docker_client, labfiles.open_lab(exec_lab).project) == {}
