"""The seed's "a late worker waits forever", with a classic MonitoredTrainingSession program of our own."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import REPO, cli
from test_docker_run import add_tasks, task_processes

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]
LATE = ("python /workspace/late_worker.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
        "--worker_hosts={worker_hosts}")


@pytest.fixture(scope="module")
def late_lab(tmp_path_factory, docker_client, base_image):
    from conftest import LabFactory

    factory = LabFactory(tmp_path_factory.mktemp("late"), docker_client)
    lab = factory.gen(nodes=3, code=REPO / "tests" / "programs")
    add_tasks(lab, {"late_filtered": LATE + " --device_filters", "late_unfiltered": LATE})
    from click.testing import CliRunner

    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    yield lab
    factory.cleanup()


def lines_of(output: str, node: str) -> list[str]:
    return [line[len(node) + 3:] for line in output.splitlines() if line.startswith(f"[{node}] ")]


def test_late_workers_with_device_filters_end_and_the_run_succeeds(late_lab: Path, runner) -> None:
    result = runner.invoke(cli, ["run", "late_filtered", "--lab", str(late_lab)])
    assert result.exit_code == 0, result.stdout[-3000:]
    # worker1 really was late: it slept through the 30 s recovery wait and ended long after the chief ...
    assert "worker1: done" in lines_of(result.stdout, "worker1")
    assert "worker0: done" in lines_of(result.stdout, "worker0")
    record = json.loads((labfiles.open_lab(late_lab).runs_dir / "late_filtered" / "run.json").read_text())
    chief, late = record["nodes"]["worker0"], record["nodes"]["worker1"]
    assert late["duration_s"] >= 30 and late["duration_s"] - chief["duration_s"] >= 15, record["nodes"]
    # ... and is called ok, not hung.
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ worker1"))
    assert " ok " in row


def test_a_late_worker_without_device_filters_is_named_with_its_cause_and_cure(late_lab: Path, runner,
                                                                               docker_client) -> None:
    started = time.monotonic()
    result = runner.invoke(cli, ["run", "late_unfiltered", "--grace", "5", "--lab", str(late_lab)])
    assert result.exit_code == 1
    assert time.monotonic() - started < 120
    text = result.stdout.replace("\n", " ")
    assert re.search(r"worker1 never printed a training step and still waited 3\ds after the chief finished, in TF1's "
                     r"SessionManager \(SessionManager\.wait_for_session \(session_manager\.py:\d+\)", text), text
    assert "classic late worker" in text and "recovery_wait_secs" in text
    assert 'device_filters=["/job:ps", "/job:worker/task:1"]' in text
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ worker1"))
    assert "hung" in row
    assert task_processes(docker_client, labfiles.open_lab(late_lab).project) == {}
