"""However a run ends, nothing it started stays in any node; detached runs outlive their terminal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import killed_after, cli
from test_docker_run import task_processes

from tflab_guard.protocol import LEASE_S, STOP_GRACE_S

from tflab.engine.containers import lab_containers, labelled
from tflab.engine.executors import exec_quiet
from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TFLAB = [sys.executable, "-m", "tflab"]


def start_run(lab: Path, *args: str) -> subprocess.Popen:
    """`tflab run` in a session of its own, as from a terminal, its output read line by line."""
    return subprocess.Popen([*TFLAB, "run", *args, "--lab", str(lab)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_until(child: subprocess.Popen, text: str, timeout: float = 180) -> str:
    """What the child printed up to the line holding `text`; killed, and a failure, once `timeout` passed
    (a run that prints nothing would block `readline` past any deadline checked between lines)."""
    seen = []
    assert child.stdout is not None
    with killed_after(child, timeout):
        for line in iter(child.stdout.readline, ""):
            seen.append(line)
            if text in line:
                return "".join(seen)
    raise AssertionError(f"never saw {text!r} within {timeout:.0f} s:\n{''.join(seen[-30:])}")


def gone_within(client, project: str, seconds: float) -> dict:
    """Wait until no task process is left in any node; what was left at the end."""
    deadline = time.monotonic() + seconds
    left = task_processes(client, project)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = task_processes(client, project)
    return left


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_a_foreground_run_stops_everything_with_a_verdict(long_lab: Path, docker_client,
                                                                       signum: int) -> None:
    project = labfiles.open_lab(long_lab).project
    child = start_run(long_lab, "long")
    read_until(child, "first step done")
    child.send_signal(signum)
    rest, _ = child.communicate(timeout=60)
    assert child.returncode == 130, rest[-2000:]
    assert "interrupted" in rest and "run summary" in rest
    assert gone_within(docker_client, project, 10) == {}
    record = json.loads((labfiles.open_lab(long_lab).runs_dir / "long" / "run.json").read_text())
    assert (record["state"], record["verdict"], record["exit_code"]) == ("finished", "interrupted", 130)


@pytest.mark.alone  # the README's 15 s from tflab's death to a clean lab, timed
def test_kill_9_of_tflab_leaves_nothing_and_the_next_run_clears_leftovers(long_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(long_lab)
    child = start_run(long_lab, "long")
    read_until(child, "first step done")
    child.kill()
    child.wait()
    killed = time.monotonic()
    # tflab's lease lapses LEASE_S after its last renewal; the guards stop everything within the grace after.
    assert gone_within(docker_client, lf.project, LEASE_S + STOP_GRACE_S + 5) == {}, "its lease must end them"
    assert time.monotonic() - killed < LEASE_S + STOP_GRACE_S + 2, "README: within 15 s of tflab's death"
    # A leftover of an earlier run whose connection never closed is cleared by the next run of the task.
    worker1 = lab_containers(docker_client, lf.project)["worker1"]
    exec_quiet(docker_client, worker1, ["sh", "-c", "(sleep 600 | python3 /usr/local/share/tflab/guard.pyz run "
                                        "run:long:worker1 --shell 'sleep 500') >/dev/null 2>&1 &"])
    time.sleep(1)

    def leftover() -> bool:
        return "sleep 500" in task_processes(docker_client, lf.project).get("worker1", "").split("; ")

    assert leftover()
    again = start_run(long_lab, "long")
    read_until(again, "first step done")
    assert not leftover()
    again.send_signal(signal.SIGINT)
    again.communicate(timeout=60)
    exec_quiet(docker_client, worker1, ["pkill", "-f", "sleep 600"])
    assert gone_within(docker_client, lf.project, 10) == {}


@pytest.mark.alone  # timed: the run ends within 120 s of a closed pipe
def test_a_closed_stdout_ends_the_run_by_itself(long_lab: Path, docker_client) -> None:
    project = labfiles.open_lab(long_lab).project
    started = time.monotonic()
    piped = subprocess.run(f"{' '.join(TFLAB)} run long --lab {long_lab} | head -n 1", shell=True,
                           capture_output=True, text=True, timeout=180)
    assert time.monotonic() - started < 120
    assert piped.stdout == "tflab: run long: servers ps0 first, then worker0, worker1\n"
    assert "the output pipe closed" in piped.stderr and "Traceback" not in piped.stderr
    assert gone_within(docker_client, project, 10) == {}


@pytest.mark.alone  # timed: the run ends within 60 s of the stop
def test_a_stopped_worker_container_ends_the_run_naming_it(own_long_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(own_long_lab)
    child = start_run(own_long_lab, "long")
    read_until(child, "[worker1] worker1: first step done")
    stopped_at = time.monotonic()
    lab_containers(docker_client, lf.project)["worker1"].stop(timeout=2)
    rest, _ = child.communicate(timeout=120)
    assert time.monotonic() - stopped_at < 60
    assert child.returncode == 1
    assert "tflab: worker1 failed with exit code" in rest and "(its container stopped)" in rest
    assert gone_within(docker_client, lf.project, 10) == {}


def test_a_detached_run_outlives_its_terminal_and_can_be_followed_and_stopped(runner, own_long_lab: Path,
                                                                               docker_client) -> None:
    lf = labfiles.open_lab(own_long_lab)
    # A terminal: a session whose leader is a shell; closing it hangs up the whole session.
    terminal = subprocess.Popen(["setsid", "sh", "-c", f"{' '.join(TFLAB)} run train -d --lab {own_long_lab}; sleep 600"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = read_until(terminal, "goes on in the background")
    assert "`tflab attach train` follows it" in said
    os.killpg(os.getpgid(terminal.pid), signal.SIGHUP)
    terminal.wait(timeout=10)
    runs = runner.invoke(cli, ["runs", "--lab", str(own_long_lab)])
    assert runs.exit_code == 0 and "running" in runs.stdout, runs.stdout
    attached = runner.invoke(cli, ["attach", "train", "--lab", str(own_long_lab)])
    assert attached.exit_code == 0, attached.stdout[-2000:]
    assert "[worker0] worker0: test accuracy" in attached.stdout and "run summary" in attached.stdout
    record = json.loads((lf.runs_dir / "train" / "run.json").read_text())
    assert (record["verdict"], record["detached"]) == ("ok", True)
    assert record["result"].startswith("worker0: test accuracy") and record["steps_per_s"] > 0

    child = subprocess.run([*TFLAB, "run", "long", "-d", "--lab", str(own_long_lab)], capture_output=True, text=True,
                           timeout=240)
    assert child.returncode == 0, child.stdout + child.stderr
    # One task at a time per node: a second task beside the detached run is refused before anything starts.
    second = runner.invoke(cli, ["run", "hello", "--lab", str(own_long_lab)])
    assert second.exit_code == 2, second.stdout
    assert second.stderr.strip() == ("tflab: error: run long holds the lab's nodes (detached): one task at a time per "
                                     "node; `tflab stop long` ends it (`tflab attach long` follows it)")
    beside = runner.invoke(cli, ["exec", "--lab", str(own_long_lab), "worker0", "hello"])
    assert beside.exit_code == 2 and "run long holds the lab's nodes" in beside.stderr
    assert not (lf.runs_dir / "hello").exists(), "nothing of it started"
    stopped = runner.invoke(cli, ["stop", "long", "--lab", str(own_long_lab)])
    assert stopped.exit_code == 0, stopped.stdout
    assert "stopped by `tflab stop`" in stopped.stdout
    assert task_processes(docker_client, lf.project) == {}
    listed = runner.invoke(cli, ["runs", "--lab", str(own_long_lab)])
    rows = [line for line in listed.stdout.splitlines() if line.startswith(("train ", "long "))]
    assert any(" ok " in row for row in rows) and any("interrupted" in row for row in rows), listed.stdout


def test_ps_in_a_node_shows_the_training_programs_own_command_line(long_lab: Path, docker_client) -> None:
    """The seed's troubleshooting line, `ps -ef | grep mnist_async.py`, finds the program: its own command line, the
    child of `tflab-guard run KEY`, as a cluster's machine shows it."""
    lf = labfiles.open_lab(long_lab)
    child = start_run(long_lab, "long")
    read_until(child, "worker0: first step done")
    worker0 = lab_containers(docker_client, lf.project)["worker0"]
    _, pid_file = exec_quiet(docker_client, worker0, ["cat", "/run/tflab/run:long:worker0.pid"])
    program = pid_file.split()[0]
    _, listing = exec_quiet(docker_client, worker0, ["sh", "-c", "ps -eo pid=,comm=,args= | grep mnist_async.py"])
    rows = {line.split(None, 2)[0]: line.split(None, 2)[1:] for line in listing.splitlines() if "grep" not in line}
    expected = ("python /workspace/mnist_async.py --job_name=worker --task_index=0 --ps_hosts=ps0:2222 "
                "--worker_hosts=worker0:2222,worker1:2222 --log_dir=/runs/long --train_steps=100000000")
    assert rows.get(program) == ["python", expected], listing
    _, parent = exec_quiet(docker_client, worker0, ["sh", "-c", f"ps -o args= -p $(ps -o ppid= -p {program})"])
    assert parent.strip() == "tflab-guard run run:long:worker0", parent
    _, stat = exec_quiet(docker_client, worker0, ["sh", "-c", f"top -b -n 1 -p {program} | tail -n 1"])
    assert stat.split()[-1] == "python", stat  # what `top` shows, the CPU and memory of the program
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=60)
    assert gone_within(docker_client, lf.project, 10) == {}


@pytest.mark.waits  # mostly waits (on the guard's tests in a pytest of their own)
def test_the_guards_own_tests_beside_a_training_lab_leave_it_alone(long_lab: Path) -> None:
    """Issue 35: the guard's unit tests, run on the host while a lab trained, failed the run with exit 137
    (a stop matched guards by their argv in the host's /proc, the lab's included)."""
    child = start_run(long_lab, "train")
    read_until(child, "first step done")
    beside = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(Path(__file__).parent / "test_guard.py"), "-k", "stop or reaches"],
                            capture_output=True, text=True, timeout=300)
    assert beside.returncode == 0, beside.stdout[-2000:]
    rest, _ = child.communicate(timeout=300)
    assert child.returncode == 0, rest[-3000:]
    exits = {cells[1].strip(): cells[3].strip() for line in rest.splitlines() if line.startswith("│ ")
             for cells in [line.split("│")]}  # the run summary's node and exit columns
    assert exits == {"ps0": "SIGTERM", "worker0": "0", "worker1": "0"}, rest[-3000:]


def test_a_signal_from_outside_tflab_is_named_as_such(long_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(long_lab)
    child = start_run(long_lab, "long")
    read_until(child, "[worker1] worker1: first step done")
    worker1 = lab_containers(docker_client, lf.project)["worker1"]
    _, pid = exec_quiet(docker_client, worker1, ["cut", "-d", " ", "-f", "1", "/run/tflab/run:long:worker1.pid"])
    exec_quiet(docker_client, worker1, ["kill", "-KILL", pid.strip()])  # someone else's kill, not tflab's
    rest, _ = child.communicate(timeout=120)
    assert child.returncode == 1
    assert "worker1 failed with exit code 137 (killed by SIGKILL from outside tflab)" in rest, rest[-3000:]
    nodes = json.loads((lf.runs_dir / "long" / "run.json").read_text())["nodes"]
    assert (nodes["worker1"]["exit_code"], nodes["worker1"]["signal"], nodes["worker1"]["reason"]) == \
        (137, "SIGKILL", "outside")
    assert nodes["worker1"]["said"] == "killed by SIGKILL from outside tflab"
    assert (nodes["ps0"]["verdict"], nodes["ps0"]["reason"]) == ("stopped", "stopped"), nodes["ps0"]
    assert gone_within(docker_client, lf.project, 10) == {}


def test_a_stream_cut_mid_run_loses_nothing_and_the_run_goes_on_to_its_verdict(long_lab: Path, docker_client) -> None:
    """The ssh sessions tflab's streams ride on are killed in a worker mid-run: the training goes on, tflab
    attaches again and reads on; the verdict is the run's own."""
    lf = labfiles.open_lab(long_lab)
    child = start_run(long_lab, "train", "--via", "ssh")
    read_until(child, "[worker1] worker1: first step done")
    worker1 = lab_containers(docker_client, lf.project)["worker1"]
    code, _ = exec_quiet(docker_client, worker1, ["pkill", "-KILL", "-f", "sshd: root@notty"])
    assert code == 0, "the worker's ssh sessions were there to cut"
    rest, _ = child.communicate(timeout=300)
    assert child.returncode == 0, rest[-3000:]
    assert "[worker1] worker1: done after" in rest, rest[-3000:]
    log = (lf.runs_dir / "train" / "logs" / "worker1.log").read_text()
    assert log.count("first step done") == 1, "no output read twice"
    assert gone_within(docker_client, lf.project, 10) == {}


def test_down_stops_a_going_run_first_recording_it_stopped_and_works_whatever_tflab_yaml_holds(
        runner, own_long_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(own_long_lab)
    started = subprocess.run([*TFLAB, "run", "long", "-d", "--lab", str(own_long_lab)], capture_output=True,
                             text=True, timeout=240)
    assert started.returncode == 0, started.stdout + started.stderr
    down = runner.invoke(cli, ["down", "--lab", str(own_long_lab)])
    assert down.exit_code == 0, down.stdout + down.stderr
    assert "stopping run long first" in down.stdout and "removed 3 nodes" in down.stdout
    record = json.loads((lf.runs_dir / "long" / "run.json").read_text())
    assert record["verdict"] == "stopped" and record["problem"] == "stopped by `tflab down`", record
    assert all(row["verdict"] in ("stopped", "served") for row in record["nodes"].values()), record["nodes"]
    assert not labelled(docker_client, f"tflab.lab={lf.project}")
    # A lab whose tflab.yaml no longer reads is still found by the project gen recorded, and taken down.
    assert runner.invoke(cli, ["up", "--lab", str(own_long_lab)]).exit_code == 0
    (own_long_lab / "tflab.yaml").write_text((own_long_lab / "tflab.yaml").read_text() + "\ntopology: [broken\n")
    broken = runner.invoke(cli, ["down", "--lab", str(own_long_lab)])
    assert broken.exit_code == 0, broken.stdout + broken.stderr
    assert f"removed 3 nodes and 1 network of {lf.project}" in " ".join(broken.stdout.split())
    assert not labelled(docker_client, f"tflab.lab={lf.project}")
