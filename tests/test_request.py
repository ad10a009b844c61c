"""A run as asked for (run/request.py) on its own: what is refused before the engine is asked, and the task's lock."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli

from tflab.errors import UserError
from tflab.host import labfiles, locks
from tflab.plan.faults import parse
from tflab.plan.knobs import Knobs
from tflab.run.request import RunRequest, prepare_run


@pytest.fixture
def lab(tmp_path: Path, runner, no_nvidia_smi) -> labfiles.LabFiles:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "4"])
    assert result.exit_code == 0, result.stderr
    return labfiles.open_lab(tmp_path / "lab")


class Side:
    """The lab's engine side, opened at most once; a run that needs no engine changes gets it untouched."""

    def __init__(self) -> None:
        self.opened = 0

    def __call__(self) -> Side:
        self.opened += 1
        return self


def test_a_run_is_prepared_with_its_plan_and_holds_its_tasks_lock(lab: labfiles.LabFiles) -> None:
    side = Side()
    prepared = prepare_run(lab, RunRequest(lab.config.task("train"), grace_s=3.0, restarts=1), side)
    try:
        assert (prepared.plan.servers, prepared.plan.finishers, prepared.plan.chief) == (
            ("ps0",), ("worker0", "worker1", "worker2"), "worker0")
        assert (prepared.plan.grace_s, prepared.plan.restarts) == (3.0, 1)
        assert prepared.side is side and side.opened == 1
        assert (prepared.doer, prepared.knob_setter) == (None, None), "no drill, no knob on the engine"
        assert locks.try_lock(locks.task_lock_path(lab.state_dir, "train")) is None, "the lock is held"
    finally:
        prepared.lock.close()
    again = locks.try_lock(locks.task_lock_path(lab.state_dir, "train"))
    assert again is not None, "closing the run's lock frees the task"
    again.close()


def test_a_task_in_use_is_refused_with_how_to_go_on(lab: labfiles.LabFiles) -> None:
    held = locks.try_lock(locks.task_lock_path(lab.state_dir, "train"))
    assert held is not None
    try:
        with pytest.raises(UserError) as refused:
            prepare_run(lab, RunRequest(lab.config.task("train")), Side())
    finally:
        held.close()
    assert str(refused.value) == (
        "task train is in use: a run of it is starting, or `tflab exec NODE train` runs in another terminal; "
        "wait until it ends (or stop it) before `tflab run train`")


@pytest.mark.parametrize(("task", "knobs", "drill", "message"), [
    ("ps_strategy", Knobs(), (), "task ps_strategy: every node only serves (ps, worker); nothing would end the "
                                 "run. Make the lab with --chief, or list fewer servers"),
    ("train", Knobs(workers=2), ("kill worker2 at step 50",),
     "--fault kill worker2: worker2 is not in this run's cluster (ps0, worker0, worker1)"),
    ("train", Knobs(link_rate="10mbit"), (), "--link-rate 10mbit shapes the nodes' links, which needs the NET_ADMIN "
                                             "capability: give the lab that: `tflab set --link-rate RATE` (or "
                                             "`--faults`), then `tflab up`"),
])
def test_what_needs_no_engine_is_refused_before_the_engine_is_asked(lab: labfiles.LabFiles, task: str,
                                                                   knobs: Knobs, drill: tuple[str, ...],
                                                                   message: str) -> None:
    side = Side()
    faults = tuple(parse(spec, lab.lab.names) for spec in drill)
    with pytest.raises(UserError) as refused:
        prepare_run(lab, RunRequest(lab.config.task(task), knobs, drill=faults), side)
    assert str(refused.value) == message
    assert side.opened == 0
    free = locks.try_lock(locks.task_lock_path(lab.state_dir, task))
    assert free is not None, "a refused run holds no lock"
    free.close()
