"""The supervision loop (run/drive.py) on its own: a real run machine, its events from a queue, a clock
the test sets, and actions carried out the way the launcher does (a stopped node's end comes back)."""

from __future__ import annotations

import queue

from tflab.run.drive import Every, drive
from tflab.run.events import Began, Exited, Finish, Serving, Start, Stop
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan

PLAN = RunPlan(servers=("ps0",), finishers=("worker0", "worker1"), chief="worker0")


class Clock:
    """Time that moves on by `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_loop_ends_once_the_run_is_decided_and_every_process_it_started_has_ended() -> None:
    machine = RunMachine(PLAN)
    events: queue.SimpleQueue = queue.SimpleQueue()
    for event in (Began(0.0), Serving("ps0", 1.0), Exited("worker0", 0, 5.0), Exited("worker1", 0, 6.0)):
        events.put(event)
    carried: list = []

    def carry_out(actions: list) -> None:
        for action in actions:
            carried.append(action)
            if isinstance(action, Stop):  # the node's end reaches the loop as a launcher's would
                for node in action.nodes:
                    events.put(Exited(node, 143, 7.0, signal="SIGTERM", ended_by="stopped"))

    drive(machine, events, carry_out, Clock(0.01))
    assert machine.finish == Finish(0, "ok", None)
    assert machine.running() == []
    assert Start(("ps0",)) in carried and Stop(("ps0",)) in carried
    assert carried.index(Start(("ps0",))) < carried.index(Stop(("ps0",)))
    assert events.empty(), "every event was read"


def test_what_is_done_every_so_often_is_done_at_that_pace_with_the_time() -> None:
    machine = RunMachine(PLAN)
    events: queue.SimpleQueue = queue.SimpleQueue()
    events.put(Began(0.0))
    events.put(Serving("ps0", 0.1))
    records: list[float] = []
    clock = Clock(0.5)

    def give_up(now: float) -> str | None:
        return "the test is over" if now >= 6.0 else None

    drive(machine, events, lambda actions: None, clock, every=[Every(2.0, records.append)], give_up=give_up)
    # the clock reads 0.5 on entry, then 1.0, 1.5, ...: every 2 s from there
    assert records == [2.5, 4.5]


def test_giving_up_records_every_process_still_running_as_ended_with_the_reason() -> None:
    machine = RunMachine(PLAN)
    events: queue.SimpleQueue = queue.SimpleQueue()
    for event in (Began(0.0), Serving("ps0", 1.0), Exited("worker0", 0, 5.0)):
        events.put(event)

    def give_up(now: float) -> str | None:
        return "worker1's node stopped answering" if now >= 3.0 else None

    drive(machine, events, lambda actions: None, Clock(0.25), give_up=give_up)
    assert machine.running() == []
    worker1, ps0 = machine.nodes["worker1"], machine.nodes["ps0"]
    assert (worker1.exit_code, worker1.reason) == (None, "worker1's node stopped answering")
    assert (ps0.exit_code, ps0.reason) == (None, "worker1's node stopped answering")
    assert worker1.ended >= 3.0 and ps0.ended >= 3.0, "each ended when the loop gave up, by the clock"
    assert machine.nodes["worker0"].exit_code == 0
