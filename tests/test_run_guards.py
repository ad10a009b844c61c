"""What keeps runs apart and honest, without an engine: the task lock, live supervisors, detached starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cli

from tflab.cli.runs import wait_until_started
from tflab.errors import UserError
from tflab.host import locks
from tflab.host.labfiles import open_lab
from tflab.run import history
from tflab.run.runreport import RUN_FILE, RunReport


@pytest.fixture
def lab(runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    folder = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(folder), "--nodes", "2"]).exit_code == 0
    return folder


def hold_in_another_process(path: Path, shared: bool) -> subprocess.Popen:
    """Another tflab process holding a task's lock (a run: alone; an exec: shared)."""
    mode = "fcntl.LOCK_SH" if shared else "fcntl.LOCK_EX"
    child = subprocess.Popen([sys.executable, "-c", f"import fcntl, sys\nf = open({str(path)!r}, 'a')\n"
                              f"fcntl.flock(f, {mode})\nprint('held', flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "held\n"
    return child


@pytest.mark.parametrize("shared", [False, True])
def test_a_task_in_use_is_not_run_again_and_its_folder_stays(runner, lab: Path, shared: bool) -> None:
    lf = open_lab(lab)
    (lf.runs_dir / "train").mkdir(parents=True)
    (lf.runs_dir / "train" / "model.ckpt.index").write_text("the running job's")
    lf.state_dir.mkdir(exist_ok=True)
    holder = hold_in_another_process(locks.task_lock_path(lf.state_dir, "train"), shared)
    try:
        result = runner.invoke(cli, ["run", "train", "--lab", str(lab)])
    finally:
        holder.stdin.close()
        holder.wait()
    assert result.exit_code == 2
    assert result.stderr.startswith("tflab: error: task train is in use: a run of it is starting, or "
                                    "`tflab exec NODE train` runs in another terminal")
    assert sorted(p.name for p in lf.runs_dir.iterdir()) == ["train"], "nothing was moved aside"


def test_execs_share_a_task_and_keep_a_run_out(tmp_path: Path) -> None:
    path = tmp_path / "task-train.lock"
    first, second = locks.try_lock(path, shared=True), locks.try_lock(path, shared=True)
    assert first is not None and second is not None
    assert locks.try_lock(path) is None
    first.close()
    second.close()
    run = locks.try_lock(path)
    assert run is not None and locks.try_lock(path, shared=True) is None
    run.close()


def test_a_recycled_pid_is_not_a_live_supervisor() -> None:
    me = RunReport(task="train", state="running", host=socket.gethostname(), pid=os.getpid())
    assert replace(me, pid_start=history.process_start(os.getpid())).is_live()
    assert not replace(me, pid_start="1").is_live(), "same pid, another process"
    assert me.is_live(), "records without a start time are judged by the pid"
    assert not replace(me, state="finished").is_live()


class Exited:
    """A detached run's process that has ended."""

    def __init__(self, pid: int, code: int) -> None:
        self.pid, self.returncode = pid, code

    def poll(self) -> int:
        return self.returncode


def test_a_detached_run_that_dies_after_starting_is_reported_at_once(tmp_path: Path) -> None:
    folder, log = tmp_path / "runs" / "train", tmp_path / "detached-train.log"
    RunReport(task="train", state="starting", pid=4242).save(folder)
    log.write_text("tflab: error: worker1 cannot start: no such container\n")
    started = time.monotonic()
    with pytest.raises(UserError, match="ended before its workers started: tflab: error: worker1 cannot start"):
        wait_until_started(Exited(4242, 3), folder, log, "train")
    assert time.monotonic() - started < 2


def test_a_detached_run_that_finished_quickly_gives_its_verdict(tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "hello"
    RunReport(task="hello", state="finished", pid=4243, exit_code=0).save(folder)
    report = wait_until_started(Exited(4243, 0), folder, tmp_path / "log", "hello")
    assert report.finished and report.exit_code == 0
    assert json.loads((folder / RUN_FILE).read_text())["pid"] == 4243


def test_a_run_moves_aside_only_a_run_folder_tflab_made(tmp_path: Path) -> None:
    # issue 30.8: with `runs: .`, a task named `data` moved the lab's own data folder aside
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "digits.csv").write_text("0,1\n")
    with pytest.raises(UserError, match=r"data is not a run tflab made .*rename it, or point the lab's runs elsewhere"):
        history.fresh_run_dir(tmp_path, "data", resume=False)
    assert (tmp_path / "data" / "digits.csv").read_text() == "0,1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
    made = history.fresh_run_dir(tmp_path, "train", resume=False)
    again = history.fresh_run_dir(tmp_path, "train", resume=False)
    assert made == again and len(list(tmp_path.glob("train.*"))) == 1, "a run tflab made is still moved aside"


def test_a_malformed_run_json_is_left_out_not_fatal_to_runs(runner, lab: Path) -> None:
    # issue 30.11: one hand-edited run.json broke `tflab runs` for the whole lab
    good = {"task": "train", "state": "finished", "started": 1700000000.0, "ended": 1700000010.0,
            "duration_s": 10.0, "verdict": "ok", "exit_code": 0, "result": "accuracy 0.97", "nodes": {}, "faults": []}
    for name, text in {"train": json.dumps(good), "a": '{"started": "x", "state": 5}', "b": "[1]",
                       "c": '{"nodes": {"w": 5}}', "d": '{"started": 1e400}', "e": "{not json"}.items():
        (lab / "runs" / name).mkdir(parents=True)
        (lab / "runs" / name / RUN_FILE).write_text(text)
    result = runner.invoke(cli, ["runs", "--lab", str(lab)], env={"COLUMNS": "160"})  # the result on one line
    assert result.exit_code == 0, result.stderr
    assert "accuracy 0.97" in result.stdout and "internal error" not in result.stdout + result.stderr
    assert "left out: a, b, c, d, e (their run.json is not one tflab wrote)" in " ".join(result.stdout.split())


def test_a_detached_run_gets_every_option_its_caller_was_given() -> None:
    """`run --detach` starts its own process with the caller's options, taken from the command, not listed by hand."""
    import typer.main

    from tflab.cli.app import app
    from tflab.cli.common import options_again

    run_cmd = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    given = ["train", "--grace", "5", "--timeout", "90", "--restarts", "1", "--resume", "--no-metrics",
             "--fault", "kill worker1 at step 5", "--fault", "pause worker0 at 3s for 2s", "--expect", "survive",
             "--workers", "2", "--link-rate", "none", "--cpus", "0.5", "--cpus", "worker0=1", "--env", "A=1 2",
             "--via", "ssh", "-d", "--lab", "/somewhere"]
    first = run_cmd.make_context("run", list(given))
    again = options_again(first, leave_out={"detach", "detached_child", "lab"})
    assert "-d" not in again and "--detach" not in again and not any(a.startswith("--lab") for a in again)
    second = run_cmd.make_context("run", ["train", *again])
    for name, value in first.params.items():
        if name not in ("detach", "lab"):
            assert second.params[name] == value, name
    assert second.params["detach"] is False


def test_a_run_moved_aside_is_named_by_when_it_started(tmp_path: Path) -> None:
    """As `tflab runs` lists it: its start, not the time its folder was last written (its end, or later)."""
    import time

    from tflab.run.runreport import RunReport

    folder = history.fresh_run_dir(tmp_path, "train", resume=False)
    started = time.mktime((2026, 12, 1, 9, 30, 0, 0, 0, -1))
    RunReport(task="train", state="finished", started=started).save(folder)
    history.fresh_run_dir(tmp_path, "train", resume=False)
    assert [p.name for p in tmp_path.glob("train.*")] == ["train.20261201-093000"]


def test_attach_to_a_finished_run_says_it_replays_it(runner, lab: Path) -> None:
    """issue 63.11: attach to a run that ended printed its output as if it were going now."""
    folder = lab / "runs" / "train"
    folder.mkdir(parents=True)
    ended = time.mktime((2026, 12, 1, 9, 30, 5, 0, 0, -1))
    RunReport(task="train", state="finished", started=ended - 60, ended=ended, verdict="ok", exit_code=0,
              result="accuracy 0.97").save(folder)
    (folder / history.OUTPUT_FILE).write_text("[worker0] step 100\n[worker0] accuracy 0.97\n")
    result = runner.invoke(cli, ["attach", "train", "--lab", str(lab)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.stderr
    assert "tflab: run train ended 2026-12-01 09:30:05 (ok); its output as it was:" in result.stderr
    assert "[worker0] accuracy 0.97" in result.stdout


def test_runs_lists_the_execs_going_ended_and_abandoned(runner, lab: Path) -> None:
    """issue 63.11: an exec session never appeared in `runs`; now each exec is a row with its state and exit code."""
    lf = open_lab(lab)
    records = history.ExecRecords(lf.state_dir / "execs" / "train")
    now = time.time()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    records.write("worker0", {"task": "train", "node": "worker0", "id": "a", "pid": dead.pid, "started": now - 300,
                              "ended": now - 240, "exit_code": 0, "verdict": "ok"})
    records.write("worker1", {"task": "train", "node": "worker1", "id": "b", "pid": me,
                              "pid_start": history.process_start(me), "started": now - 30, "ended": None})
    records.write("worker1", {"task": "train", "node": "worker1", "id": "c", "pid": dead.pid, "started": now - 200,
                              "ended": None})
    result = runner.invoke(cli, ["runs", "--lab", str(lab)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.stderr
    rows = [" ".join(line.split()) for line in result.stdout.splitlines() if "train" in line and "│" in line]
    assert [r.split("│")[1].strip() for r in rows] == ["worker0 train", "worker1 train", "worker1 train"], rows
    assert "│ 60.0s │" in rows[0], rows[0]
    assert rows[0].endswith("ok │ 0 │") and rows[1].endswith("abandoned │ - │") and rows[2].endswith("running │ - │")
    assert "no runs yet" not in result.stdout
