"""One `tflab run TASK` put together (run/task_run.py), with the launcher's fake nodes: its folder, its record,
the commands each node is given (knobs filled in), and the calls around it however it ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli
from test_launcher import FakeExecutor, Lines, ok_scripts

from tflab.host import labfiles
from tflab.plan.knobs import Knobs
from tflab.plan.config import Task
from tflab.run.runplan import run_plan
from tflab.run.task_run import RunOptions, TaskRun

TASK = Task("train", "python t.py --job={job_name} --index={task_index} --rate={RATE} --out={run_dir}")


@pytest.fixture
def lab(tmp_path: Path, runner, no_nvidia_smi) -> labfiles.LabFiles:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "4", "--cpus-per-node", "0",
                                 "--memory-per-node", "0"])
    assert result.exit_code == 0, result.stderr
    return labfiles.open_lab(tmp_path / "lab")


def session(lf: labfiles.LabFiles, executor: FakeExecutor, sink: Lines, **options) -> TaskRun:
    return TaskRun(lf, executor, TASK, run_plan(lf.lab, TASK), RunOptions(metrics=False, **options),
                   lambda log: sink)


def test_a_run_writes_its_record_and_gives_each_node_its_own_command(lab: labfiles.LabFiles) -> None:
    executor, sink, calls = FakeExecutor(ok_scripts()), Lines(), []
    run = session(lab, executor, sink, knobs=Knobs(env={"RATE": "0.5"}))
    result, report = run.execute(on_start=lambda: calls.append("start"), on_end=lambda: calls.append("end"))
    assert calls == ["start", "end"]
    assert (result.finish.verdict, result.result_line) == ("ok", "worker0: test accuracy 0.97")
    assert (report.verdict, report.exit_code, report.result) == ("ok", 0, "worker0: test accuracy 0.97")
    saved = json.loads((lab.runs_dir / "train" / "run.json").read_text())
    assert (saved["task"], saved["verdict"]) == ("train", "ok")
    assert saved["knobs"] == {"workers": None, "link_rate": None, "cpus": {}, "env": {"RATE": "0.5"}}
    started = {node: " ".join(argv) for node, argv in executor.commands if "python t.py" in " ".join(argv)}
    assert started["ps0"].endswith("python t.py --job=ps --index=0 --rate=0.5 --out=/runs/train")
    assert started["worker2"].endswith("python t.py --job=worker --index=2 --rate=0.5 --out=/runs/train")
    assert ("worker0", "worker0: test accuracy 0.97") in sink.lines


def test_the_next_run_moves_the_last_aside_unless_it_resumes(lab: labfiles.LabFiles) -> None:
    session(lab, FakeExecutor(ok_scripts()), Lines()).execute()
    (lab.runs_dir / "train" / "model.ckpt-1.index").write_text("a checkpoint")
    session(lab, FakeExecutor(ok_scripts()), Lines()).execute()
    aside = sorted(p.name for p in lab.runs_dir.iterdir() if p.name.startswith("train."))
    assert len(aside) == 1 and (lab.runs_dir / aside[0] / "model.ckpt-1.index").is_file()
    assert not (lab.runs_dir / "train" / "model.ckpt-1.index").exists(), "a fresh run reads nothing stale"
    (lab.runs_dir / "train" / "model.ckpt-2.index").write_text("a checkpoint")
    session(lab, FakeExecutor(ok_scripts()), Lines(), resume=True).execute()
    assert (lab.runs_dir / "train" / "model.ckpt-2.index").is_file()
    assert len([p for p in lab.runs_dir.iterdir() if p.name.startswith("train.")]) == 1


def test_the_calls_around_a_run_are_made_however_it_ends(lab: labfiles.LabFiles) -> None:
    calls: list[str] = []

    def refuse() -> None:
        calls.append("start")
        raise RuntimeError("the knobs could not be set")

    run = session(lab, FakeExecutor(ok_scripts()), Lines())
    with pytest.raises(RuntimeError, match="the knobs could not be set"):
        run.execute(on_start=refuse, on_end=lambda: calls.append("end"))
    assert calls == ["start", "end"]
    assert run.output_log.closed
