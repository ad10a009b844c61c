"""A run's drills as bookkeeping (run/drills.py), called directly: when each fault is due and healed, which fault
a node's end belongs to, when a drilled run has stalled, and its verdict against --expect (literal sentences)."""

from __future__ import annotations

import pytest

from tflab.plan.faults import parse
from tflab.run.drills import Drills
from tflab.run.events import Finish

NODES = ["ps0", "worker0", "worker1", "worker2"]


def drills(*specs: str, stall_s: float = 60.0) -> Drills:
    return Drills([parse(spec, NODES) for spec in specs], stall_s)


def test_a_fault_is_due_once_at_its_step_or_its_time_from_the_release() -> None:
    course = drills("kill worker1 at step 50", "pause worker2 at 30s for 10s")
    assert course.due(5.0, None, 80) == [], "nothing before the workers are released"
    assert course.due(5.0, 2.0, 49) == []
    assert course.due(6.0, 2.0, 50) == [0]
    assert course.due(7.0, 2.0, 60) == [], "each once"
    assert course.due(31.9, 2.0, 90) == []
    assert course.due(32.0, 2.0, 90) == [1]


def test_a_lasting_fault_is_healed_after_its_time_and_notes_the_steps_made_meanwhile() -> None:
    course = drills("pause worker2 at step 100 for 15s")
    assert course.due(10.0, 2.0, 104, {"worker0": 90, "worker1": 104, "worker2": None}) == [0]
    course.hit(0, 10.0, 10.3, "paused worker2", None)
    assert course.heal_due(24.9) == []
    assert course.heal_due(25.0) == [0]
    course.note_steps({"worker0": 500, "worker1": 480, "worker2": None})
    course.heal(0, 25.2, "unpaused worker2", {"worker0": 520, "worker1": 490})
    assert course.heal_due(40.0) == [], "healed once"
    course.note_steps({"worker0": 900})
    row = course.rows(2.0)[0]
    assert row == {"fault": "pause worker2 at step 100 for 15s", "what": "pause worker2", "planned": "step 100",
                   "hit_s": 8.0, "hit_step": 104, "done": "paused worker2", "error": None, "healed_s": 23.2,
                   "healed": "unpaused worker2", "back_s": None,
                   "during": {"worker0": [90, 520], "worker1": [104, 490], "worker2": [None, None]}}


def test_a_worker_still_starting_when_a_fault_hits_is_in_its_record_with_the_steps_it_made_while_it_was_on() -> None:
    """A loaded host (a fresh clone's run): worker0 reached step 100 before worker1 had taken its first step, and
    worker1 then trained while worker2 was paused. The record left it out, as if it had done nothing: the drill
    test found it so (KeyError 'worker1'). The paused worker, which had reported no step either, says none."""
    from rich.console import Console

    from tflab.cli.views import drill_table

    course = drills("pause worker2 at step 100 for 15s")
    assert course.due(10.0, 2.0, 100, {"worker0": 100, "worker1": None, "worker2": None}) == [0]
    course.hit(0, 10.0, 10.3, "paused worker2", None)
    course.note_steps({"worker0": 300, "worker1": 180, "worker2": None})
    course.heal(0, 25.2, "unpaused worker2", {"worker0": 420, "worker1": 310, "worker2": None})
    rows = course.rows(2.0)
    assert rows[0]["during"] == {"worker0": [100, 420], "worker1": [None, 310], "worker2": [None, None]}
    console = Console(width=250, record=True)
    console.print(drill_table(rows))
    assert "worker0 100→420, worker1 no step→310, worker2 no step" in console.export_text()


def test_a_fault_hits_when_the_injector_begins_at_the_steps_it_fell_due_at_however_long_the_injector_takes() -> None:
    """A fresh clone's loaded run: a kill due at step 75 took effect at once, its `docker exec` returned at step
    550; the drill said it hit at step 550. What fell due is what hit: the step, each worker's, and the time."""
    course = drills("kill worker1 at step 75")
    assert course.due(6.0, 2.0, 75, {"worker0": 75, "worker1": 70, "worker2": 72}) == [0]
    course.note_steps({"worker0": 550, "worker1": 70, "worker2": 548})  # what the steps do while the injector works
    course.hit(0, 6.0, 19.5, "killed worker1 (its machine)", None)
    row = course.rows(2.0)[0]
    assert (row["hit_s"], row["hit_step"], row["during"]) == (4.0, 75, {"worker0": [75, 75], "worker1": [70, 70],
                                                                       "worker2": [72, 72]})
    assert course.names() == "kill worker1 at step 75 (planned at step 75)"
    assert course.stalled(19.5 + 60.0, None) is None, "a stall is counted from when the injector was done"
    assert course.stalled(19.6 + 60.0, None) is course.states[0]

def test_a_nodes_end_belongs_to_the_fault_that_downed_it_until_it_is_back_and_to_the_last_one_after() -> None:
    course = drills("kill worker1 at step 50 then restart", "restart worker1 at step 400", "pause worker2 at 5s")
    assert course.downed("worker1") is None and course.last_on("worker1") is None
    assert course.due(6.0, 2.0, 52) == [0]
    course.hit(0, 6.0, 6.1, "killed worker1", None)
    assert course.downed("worker1") is course.states[0]
    assert course.downed("worker2") is None
    course.back("worker1", 9.0)
    assert course.downed("worker1") is None, "back"
    assert course.last_on("worker1") is course.states[0], "its old process's end is still the drill's"
    assert course.due(30.0, 2.0, 401) == [1, 2]
    course.hit(1, 30.0, 38.0, "restarted worker1", None)
    assert course.last_on("worker1") is course.states[1]
    course.hit(2, 30.0, 30.1, None, "worker2's node is gone")
    assert course.last_on("worker2") is None, "a pause ends no process"


def test_a_drilled_run_that_makes_no_progress_is_stalled_naming_the_last_fault() -> None:
    course = drills("cut ps0 at step 100 for 10s", stall_s=60.0)
    assert course.stalled(500.0, None) is None, "no drill has done anything yet"
    assert course.due(10.0, 2.0, 100) == [0]
    course.hit(0, 10.0, 10.2, "cut ps0", None)
    course.heal(0, 20.0, "ps0 reconnected", {})
    assert course.stalled(80.0, 15.0) is None
    assert course.stalled(80.1, 15.0) is course.states[0]
    assert course.stalled(80.1, 30.0) is None, "progress after the heal counts"


@pytest.mark.parametrize(("finish", "expect", "hit", "judged"), [
    (Finish(0, "ok", None), "survive", True, Finish(0, "ok", None)),
    (Finish(1, "failed", "worker0 failed (exit 1)"), "survive", True,
     Finish(1, "failed", "worker0 failed (exit 1) (the drill: kill worker1 at step 52 (planned at step 50))")),
    (Finish(1, "failed", "worker0 failed (exit 1)"), "fail", True,
     Finish(0, "ok", "as expected, the drill broke the training: worker0 failed (exit 1) (kill worker1 at step 52 "
                     "(planned at step 50))")),
    (Finish(0, "ok", None), "fail", True,
     Finish(1, "survived", "the training finished despite the drill (kill worker1 at step 52 (planned at step 50)); "
                           "it was expected to fail")),
    (Finish(0, "ok", None), "survive", False,
     Finish(1, "missed", "the drill did not happen: kill worker1 (planned at step 50) never hit (the training ended "
                         "first)")),
    (Finish(0, "ok", None), None, False, Finish(0, "ok", None)),
    (Finish(130, "interrupted", "interrupted"), "survive", False, Finish(130, "interrupted", "interrupted")),
])
def test_the_verdict_of_a_drilled_run_against_what_was_expected(finish: Finish, expect: str | None, hit: bool,
                                                                 judged: Finish) -> None:
    course = drills("kill worker1 at step 50")
    if hit:
        course.due(6.0, 2.0, 52)
        course.hit(0, 6.0, 6.1, "killed worker1", None)
    assert course.judge(finish, expect) == judged


def test_a_run_without_a_drill_is_judged_as_it_ended() -> None:
    assert Drills([]).judge(Finish(1, "failed", "worker0 failed (exit 1)"), None) == \
        Finish(1, "failed", "worker0 failed (exit 1)")
