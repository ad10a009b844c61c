"""run.json as one typed record: written and read back whole, a malformed one read as none."""

from __future__ import annotations

import json
from pathlib import Path

from tflab.run.runreport import RUN_FILE, NodeRow, RunReport, load


def test_a_report_is_read_back_as_it_was_written(tmp_path: Path) -> None:
    report = RunReport(task="train", state="finished", pid=42, host="h", started=1.5, ended=9.0, verdict="ok",
                       exit_code=0, result="worker0: test accuracy 0.97", steps_per_s=5.2, steady_steps_per_s=5.4,
                       limit={"kind": "link", "evidence": "ps0 sent 19 Mbit/s of its 20mbit link"},
                       knobs={"workers": 2}, cluster={"ps0": {"cpu": 0.5, "tx_mbit": 19.0, "rx_mbit": 3.0}},
                       faults=[{"fault": "pause worker1 at 5s for 2s"}],
                       nodes={"ps0": NodeRow("server", 1, None, "served"), "worker0": NodeRow("finisher", 1, 0, "ok")})
    report.save(tmp_path)
    assert load(tmp_path) == report
    assert json.loads((tmp_path / RUN_FILE).read_text())["nodes"]["worker0"]["exit_code"] == 0


def test_a_record_tflab_did_not_write_is_no_record(tmp_path: Path) -> None:
    def read(text: str) -> RunReport | None:
        (tmp_path / RUN_FILE).write_text(text)
        return load(tmp_path)

    assert read('{"task": "train", "state": "running", "pid": "42"}') is None
    assert read('{"task": "train", "state": "running", "steps_per_s": NaN}') is None
    assert read('{"task": "train", "state": "running", "nodes": {"w": {"role": "finisher", "attempt": "x"}}}') is None
    assert read('{"task": "train", "state": "running", "nodes": {"w": []}}') is None
    assert read('{"state": "running"}') is None
    assert read("[]") is None and read("{") is None
    kept = read('{"task": "train", "state": "running", "detached": true, "added_later": 1}')
    assert kept == RunReport(task="train", state="running", detached=True), "keys of another tflab are left out"


def test_each_nodes_own_rate_and_the_clusters_global_rate_are_kept_apart(tmp_path: Path) -> None:
    """A between-graph run: worker0 made 100 steps of its own, worker1 200, both saw the global step go 0 to 300 in
    10 s. Each node's steps/s is its own (not 30 each, summing to twice the truth); the cluster's is the global
    step's, said once. A node that shows only the global step has it labelled as that."""
    from tflab.cli import views
    from tflab.plan.topology import Topology, plan
    from tflab.run.events import Began, Printed, Serving
    from tflab.run.history import RunRecorder, node_rows
    from tflab.run.machine import RunMachine
    from tflab.run.runplan import RunPlan

    machine = RunMachine(RunPlan(servers=("ps0",), finishers=("worker0", "worker1", "worker2"), chief="worker0"))
    events = [Began(0.0), Serving("ps0", 1.0)]
    for t in range(0, 11):
        events += [Printed("worker0", 1.0 + t, step=10 * t, global_step=30 * t),
                   Printed("worker1", 1.0 + t, step=20 * t, global_step=30 * t),
                   Printed("worker2", 1.0 + t, global_step=30 * t)]
    for event in events:
        machine.handle(event)
    rows = node_rows(machine)
    assert (rows["worker0"].steps_per_s, rows["worker1"].steps_per_s, rows["worker2"].steps_per_s) == (10.0, 20.0, None)
    assert rows["worker2"].global_steps_per_s == 30.0
    report = RunRecorder(tmp_path, "train", False, 0.0).write("running", machine)
    assert (report.steps_per_s, report.steps_are_global) == (30.0, True)
    from rich.console import Console

    console = Console(width=100, record=True)
    console.print(views.run_summary(plan(Topology(nodes=4), []), rows))
    text = console.export_text()
    assert "│ 10.0 " in text and "│ 20.0 " in text and "30.0 (global)" in text


def test_a_live_run_or_exec_of_another_task_holds_the_nodes(tmp_path: Path) -> None:
    """One task at a time per node: what of another task is live is named, with the command that ends it."""
    import os

    from tflab.host.proc import process_start
    from tflab.run.history import ExecRecords, holding

    runs, execs = tmp_path / "runs", tmp_path / "execs"
    (runs / "train").mkdir(parents=True)
    me = {"pid": os.getpid(), "pid_start": process_start(os.getpid())}
    RunReport(task="train", state="running", detached=True, host=__import__("socket").gethostname(), **me).save(
        runs / "train")
    assert holding(runs, execs, "hello") == ("run train holds the lab's nodes (detached): one task at a time per node; "
                                             "`tflab stop train` ends it (`tflab attach train` follows it)")
    assert holding(runs, execs, "train") is None, "its own task: the task's lock says that"
    RunReport(task="train", state="finished", **me).save(runs / "train")
    assert holding(runs, execs, "hello") is None
    ExecRecords(execs / "allreduce").write("worker0", {"task": "allreduce", "node": "worker0", "id": "1", "ended": None,
                                                       **me})
    assert holding(runs, execs, "hello").startswith("`tflab exec worker0 allreduce` holds the lab's nodes")


def test_logs_read_whole_lines_from_an_offset_each_as_a_terminal_leaves_it(tmp_path: Path) -> None:
    from tflab.cli.lifecycle import new_lines

    log = tmp_path / "worker0.log"
    log.write_bytes(b"one\n\r 1/3 [..]\r 3/3 [==] - 1s\ntwo\npartial")
    lines, offset = new_lines(log, 0, None)
    assert lines == ["one", " 3/3 [==] - 1s", "two"] and offset == len(b"one\n\r 1/3 [..]\r 3/3 [==] - 1s\ntwo\n")
    assert new_lines(log, offset, None) == ([], offset), "a line not ended yet waits for its end"
    assert new_lines(log, 0, 1)[0] == ["two"], "--tail"
