"""A run's knobs noted in the lab (engine/run_knobs.py) on its own: what the next tflab reads of a run that changed
the nodes, whether that run is gone, and a note it cannot read. Setting the knobs on nodes is test_docker_knobs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli

from tflab.engine import run_knobs
from tflab.host import labfiles
from tflab.host.proc import process_start


@pytest.fixture
def lab(tmp_path: Path, runner, no_nvidia_smi) -> labfiles.LabFiles:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "3", "--faults"])
    assert result.exit_code == 0, result.stderr
    return labfiles.open_lab(tmp_path / "lab")


def test_a_note_is_read_back_as_written_and_cleared(lab: labfiles.LabFiles) -> None:
    assert run_knobs.read_note(lab) is None
    note = {"task": "train", "pid": os.getpid(), "pid_start": process_start(os.getpid()),
            "link": ["ps0", "worker0"], "cpus": ["worker1"]}
    run_knobs.write_note(lab, note)
    assert run_knobs.read_note(lab) == note
    assert not run_knobs.left_behind(lab), "this process is alive: its run is not gone"
    assert [p.name for p in lab.state_dir.iterdir() if "run-knobs" in p.name] == ["run-knobs.json"], "no temp file left"
    run_knobs.clear_note(lab)
    assert run_knobs.read_note(lab) is None
    run_knobs.clear_note(lab)  # twice: nothing to clear is not an error


def test_a_run_that_is_gone_left_its_knobs_behind(lab: labfiles.LabFiles) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = process_start(child.pid)
    run_knobs.write_note(lab, {"task": "train", "pid": child.pid, "pid_start": started, "link": [], "cpus": ["ps0"]})
    assert not run_knobs.left_behind(lab)
    child.kill()
    child.wait()
    assert run_knobs.left_behind(lab)
    # the same pid given to another process since is not the run's: its start time differs
    run_knobs.write_note(lab, {"task": "train", "pid": os.getpid(), "pid_start": "1", "link": [], "cpus": ["ps0"]})
    assert run_knobs.left_behind(lab)


@pytest.mark.parametrize(("text", "read"), [
    ("{not json", {"task": "?", "link": [], "cpus": []}),
    ("[1, 2]", {"task": "?", "link": [], "cpus": []}),
    ('{"task": "train", "link": ["ps0", 7, null], "cpus": "worker0"}', {"task": "train", "link": ["ps0"], "cpus": []}),
])
def test_a_note_it_cannot_read_is_still_a_note_of_changed_nodes(lab: labfiles.LabFiles, text: str, read: dict) -> None:
    lab.state_file(run_knobs.KNOBS_FILE).write_text(text)
    assert run_knobs.read_note(lab) == read
    assert run_knobs.left_behind(lab), "no live run owns it: the next tflab restores the lab"
