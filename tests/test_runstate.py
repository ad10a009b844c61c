"""The run's verdicts from literal event sequences: no Docker, no threads, no clock."""

from __future__ import annotations

import random

import pytest

import fakeguard

from tflab.run.events import (
    Began,
    Exited,
    Finish,
    Inspect,
    Interrupt,
    NotServing,
    Printed,
    Release,
    Say,
    Serving,
    Stacks,
    Start,
    Stop,
    Tick,
)
from tflab.run.runplan import RunPlan
from tflab.run.machine import RunMachine

PLAN = RunPlan(servers=("ps0",), finishers=("worker0", "worker1", "worker2"), chief="worker0",
               task_index={"worker0": 0, "worker1": 1, "worker2": 2})


def feed(machine: RunMachine, events: list) -> list:
    actions = []
    for event in events:
        actions += machine.handle(event)
    return actions


def started(plan: RunPlan = PLAN) -> RunMachine:
    """A machine whose servers serve and whose workers were released at t=5."""
    machine = RunMachine(plan)
    feed(machine, [Began(0.0), Serving("ps0", 5.0)])
    return machine


def verdicts(machine: RunMachine) -> dict[str, str]:
    return {name: node.verdict for name, node in machine.nodes.items()}


def stacks(node: str, t: float, dump: str | None) -> Stacks:
    """`node`'s stacks as the guard answers them: a real dump of tests/fixtures/stacks, or none (no process)."""
    code, output = fakeguard.stack(dump)
    return Stacks(node, t, output if code == 0 else None, None if code == 0 else "its process had ended")


def test_servers_first_then_the_held_workers_are_released_once_they_serve() -> None:
    machine = RunMachine(PLAN)
    assert machine.handle(Began(0.0)) == [Start(("ps0",)), Start(("worker0", "worker1", "worker2"), held=True)]
    assert machine.handle(Tick(3.0)) == []
    assert machine.handle(Serving("ps0", 5.0)) == [
        Say("ps0 is serving on ps0:2222"), Say("starting worker0, worker1, worker2"),
        Release(("worker0", "worker1", "worker2")),
    ]


def test_a_lab_without_servers_starts_its_workers_at_once() -> None:
    machine = RunMachine(RunPlan(servers=(), finishers=("worker0", "worker1"), chief="worker0"))
    assert machine.handle(Began(0.0)) == [Start(("worker0", "worker1"))]


def test_every_worker_ok_stops_the_servers_and_succeeds() -> None:
    machine = started()
    actions = feed(machine, [Exited("worker1", 0, 20.0), Exited("worker2", 0, 20.5)])
    assert actions == []
    actions = machine.handle(Exited("worker0", 0, 21.0))
    assert actions == [Stop(("ps0",)), Finish(0, "ok")]
    assert machine.handle(Exited("ps0", 143, 21.2)) == []
    assert verdicts(machine) == {"ps0": "served", "worker0": "ok", "worker1": "ok", "worker2": "ok"}


def test_workers_ending_at_the_same_instant_are_all_ok_in_any_order() -> None:
    rng = random.Random(20261123)
    for _ in range(1000):
        machine = started()
        events = [Exited(w, 0, 30.0) for w in ("worker0", "worker1", "worker2")]
        events += [Printed(w, 29.9, rng.randrange(1500)) for w in ("worker0", "worker1", "worker2")]
        events.append(Tick(30.0))
        rng.shuffle(events)
        actions = feed(machine, events)
        finishes = [a for a in actions if isinstance(a, Finish)]
        assert finishes == [Finish(0, "ok")], events
        assert verdicts(machine) == {"ps0": "served", "worker0": "ok", "worker1": "ok", "worker2": "ok"}
        # The servers' own exit, whenever it comes, changes nothing.
        assert machine.handle(Exited("ps0", -9, 31.0)) == [] and machine.finish == Finish(0, "ok")


def test_a_failing_worker_stops_the_rest_and_names_itself() -> None:
    machine = started()
    actions = machine.handle(Exited("worker1", 137, 12.0))
    assert actions == [Stop(("ps0", "worker0", "worker2")), Finish(1, "failed", "worker1 failed with exit code 137")]
    assert verdicts(machine) == {"ps0": "stopped", "worker0": "stopped", "worker1": "failed", "worker2": "stopped"}


def test_two_workers_failing_at_once_are_both_failed_whatever_failed_first() -> None:
    """The second's exit comes after the first has ended the run; its record says it failed by itself, not that tflab
    stopped it: `failed`, with its exit code, as the first. A node tflab did stop stays `stopped`."""
    for first, second in (("worker1", "worker2"), ("worker2", "worker1")):
        machine = started()
        actions = feed(machine, [Exited(first, 1, 12.0, ended_by="exited"), Exited(second, 1, 12.01, ended_by="exited"),
                                 Exited("worker0", 143, 12.3, signal="SIGTERM", ended_by="stopped"),
                                 Exited("ps0", 143, 12.3, signal="SIGTERM", ended_by="stopped")])
        assert [a for a in actions if isinstance(a, Finish)] == [Finish(1, "failed", f"{first} failed with exit code 1")]
        assert verdicts(machine) == {"ps0": "stopped", "worker0": "stopped", "worker1": "failed", "worker2": "failed"}
        assert machine.nodes[second].exit_code == 1
    crashed = started()
    feed(crashed, [Exited("worker1", 1, 12.0, ended_by="exited"),
                   Exited("worker2", 139, 12.1, signal="SIGSEGV", ended_by="crashed"),
                   Exited("worker0", 137, 12.2, signal="SIGKILL", ended_by="oom")])
    assert verdicts(crashed) == {"ps0": "stopped", "worker0": "oom", "worker1": "failed", "worker2": "failed"}
    unknown = started()
    feed(unknown, [Exited("worker1", 1, 12.0, ended_by="exited"), Exited("worker2", 1, 12.1)])
    assert verdicts(unknown)["worker2"] == "stopped", "no record of its own: nothing says it failed by itself"


def test_a_worker_whose_container_stopped_is_named_with_why() -> None:
    machine = started()
    actions = machine.handle(Exited("worker1", 137, 12.0, "its container stopped"))
    assert actions[-1] == Finish(1, "failed", "worker1 failed with exit code 137 (its container stopped)")
    lost = started()
    assert lost.handle(Exited("worker2", None, 9.0, "lost the connection to it while it still ran"))[-1] == Finish(
        1, "failed", "worker2 failed: ended with no exit code: lost the connection to it while it still ran")


def test_a_failed_worker_is_restarted_when_allowed_but_the_chief_never() -> None:
    plan = RunPlan(servers=("ps0",), finishers=("worker0", "worker1"), chief="worker0", restarts=1)
    machine = started(plan)
    assert machine.handle(Exited("worker1", 137, 10.0)) == [
        Say("worker1 exited with 137; restart 1 of 1"), Start(("worker1",), attempt=2)]
    assert machine.nodes["worker1"].attempt == 2
    assert machine.handle(Exited("worker1", 0, 30.0)) == []
    assert machine.handle(Exited("worker0", 0, 31.0)) == [Stop(("ps0",)), Finish(0, "ok")]
    again = started(plan)
    assert again.handle(Exited("worker0", 1, 10.0))[-1] == Finish(1, "failed", "worker0 failed with exit code 1")


def test_the_ps_dying_ends_the_run_at_once_naming_it() -> None:
    machine = started()
    actions = machine.handle(Exited("ps0", 137, 40.0))
    assert actions == [Stop(("worker0", "worker1", "worker2")),
                       Finish(1, "failed", "ps0 exited with 137 while the workers were running")]
    early = RunMachine(PLAN)
    early.handle(Began(0.0))
    assert early.handle(Exited("ps0", 1, 2.0))[-1] == Finish(1, "failed", "ps0 exited with 1 before serving on port 2222")


def test_a_server_that_never_serves_fails_the_run_when_its_wait_says_so_not_at_a_clock() -> None:
    """The machine keeps no clock of its own for a server: a ps busy starting in a node held to 0.1 CPU is
    waited for past the ready timeout (guardwait.await_serving), and the run fails when that wait ends."""
    machine = RunMachine(PLAN)
    machine.handle(Began(0.0))
    assert machine.handle(Tick(119.0)) == [] and machine.handle(Tick(600.0)) == []
    stuck = "ps0 did not serve on port 2222 within 120s, and its processes used no CPU in the last 15s: it is stuck"
    assert machine.handle(NotServing("ps0", 601.0, stuck)) == [Stop(("ps0", "worker0", "worker1", "worker2")),
                                                              Finish(1, "failed", stuck)]
    assert machine.handle(NotServing("ps0", 602.0, "again")) == [], "a finished run hears nothing more"


def test_a_server_started_again_by_a_drill_that_does_not_serve_is_said_not_failed() -> None:
    machine = started()
    assert machine.handle(NotServing("ps0", 50.0, "ps0 could not be asked")) == [], "ps0 serves: its wait is over"
    machine.nodes["ps0"].serving = False  # as after a drill restarted it
    assert machine.handle(NotServing("ps0", 60.0, "ps0 could not be asked")) == [Say("ps0 could not be asked")]
    assert machine.finish is None


def test_a_silent_worker_after_the_chief_is_hung_and_stopped() -> None:
    machine = started()
    feed(machine, [Printed("worker2", 8.0, 10), Printed("worker2", 9.0, 20), Exited("worker0", 0, 10.0),
                   Exited("worker1", 0, 10.0)])
    assert machine.handle(Tick(39.0)) == []
    assert machine.handle(Tick(40.5)) == [Inspect(("worker2",))], "where it waits is read first"
    actions = machine.handle(stacks("worker2", 41.0, "own_retry_loop"))
    assert actions == [Say("worker2 waits in the program's own code: with_retries.<locals>.wrap.<locals>.wrapped "
                           "(retry.py:9) ← main (retry.py:19)"), Stop(("worker2",))]
    assert machine.nodes["worker2"].verdict == "hung"
    assert machine.handle(Exited("worker2", 143, 41.5)) == [
        Stop(("ps0",)),
        Finish(1, "hung", "worker2 still running 30s after the chief finished, silent for 31s, waiting in the program's "
                          "own code (with_retries.<locals>.wrap.<locals>.wrapped (retry.py:9) ← main (retry.py:19)): "
                          "reported hung and stopped"),
    ]


def test_a_worker_still_printing_steps_after_the_chief_is_not_hung() -> None:
    machine = started()
    feed(machine, [Printed("worker1", 9.0, 1), Exited("worker0", 0, 10.0), Exited("worker2", 0, 10.0)])
    for t in range(11, 80):
        assert machine.handle(Printed("worker1", float(t), t)) == []
        assert machine.handle(Tick(t + 0.5)) == []
    assert machine.handle(Exited("worker1", 0, 80.0))[-1] == Finish(0, "ok")


def test_a_late_worker_ending_35s_after_the_chief_is_ok() -> None:
    # worker2 asked before the chief was ready and slept through TF's 30 s recovery wait.
    machine = started()
    feed(machine, [Printed("worker2", 6.0, None), Printed("worker0", 7.0, 0), Exited("worker0", 0, 10.0),
                   Exited("worker1", 0, 10.0)])
    for t in range(11, 45):
        assert machine.handle(Tick(float(t))) == []
    feed(machine, [Printed("worker2", 40.0, 1500)])
    actions = machine.handle(Exited("worker2", 0, 45.0))
    assert actions == [Stop(("ps0",)), Finish(0, "ok")]
    assert verdicts(machine) == {"ps0": "served", "worker0": "ok", "worker1": "ok", "worker2": "ok"}


def test_a_late_worker_still_waiting_is_the_classic_hang_with_its_cure() -> None:
    """The late-worker verdict and its cure only where the stack shows the session's wait (TF1's SessionManager)."""
    machine = started()
    feed(machine, [Printed("worker2", 6.0, None), Exited("worker0", 0, 10.0), Exited("worker1", 0, 10.0)])
    assert machine.handle(Tick(69.0)) == []  # the recovery wait (30 s) and the grace (30 s) are its due
    assert machine.handle(Tick(70.5)) == [Inspect(("worker2",))]
    actions = machine.handle(stacks("worker2", 70.8, "tf1_session_wait"))
    assert actions[0] == Say("worker2 waits in TF1's SessionManager for the chief's session (SessionManager."
                             "wait_for_session (session_manager.py:457) ← WorkerSessionCreator.create_session "
                             "(monitored_session.py:715) ← … ← <module> (late.py:8))")
    assert actions[1:] == [Stop(("worker2",))]
    actions = machine.handle(Exited("worker2", 143, 71.0))
    assert actions[-1].verdict == "hung"
    problem = actions[-1].problem
    assert problem.startswith("worker2 never printed a training step and still waited 61s after the chief "
                              "finished, in TF1's SessionManager (SessionManager.wait_for_session (")
    assert "reported hung and stopped. This is the classic late worker" in problem
    assert "recovery_wait_secs" in problem
    assert 'device_filters=["/job:ps", "/job:worker/task:2"]' in problem


@pytest.mark.parametrize("dump, where", [
    ("own_retry_loop", ", waiting in the program's own code (with_retries.<locals>.wrap.<locals>.wrapped (retry.py:9) "
                       "← main (retry.py:19))"),
    (None, " (where it waits could not be read)"),
])
def test_a_worker_that_never_trained_is_no_late_worker_unless_its_stack_says_so(dump: str | None, where: str) -> None:
    """Asleep in its own retry loop, or with no stack that could be read: where it waits, and no guessed cure."""
    machine = started()
    feed(machine, [Printed("worker2", 6.0, None), Exited("worker0", 0, 10.0), Exited("worker1", 0, 10.0)])
    assert machine.handle(Tick(70.5)) == [Inspect(("worker2",))]
    feed(machine, [stacks("worker2", 71.0, dump) if dump else Tick(91.0)])  # none came: decided after INSPECT_WAIT_S
    actions = machine.handle(Exited("worker2", 143, 92.0))
    problem = actions[-1].problem
    assert problem.startswith(f"worker2 never printed a training step and still waited")
    assert where + ": reported hung and stopped" in problem and "device_filters" not in problem


def test_a_worker_that_only_serves_when_the_chief_succeeded_served_and_the_run_is_ok() -> None:
    """A chief lab whose workers only serve (server.join(), as the operator's smoke tests do): a TFJob ends it as a
    success when the chief succeeds; the workers are stopped as a ps is, their verdict `served`."""
    plan = RunPlan(servers=("ps0",), finishers=("chief", "worker0", "worker1"), chief="chief",
                   task_index={"chief": 0, "worker0": 0, "worker1": 1})
    machine = started(plan)
    feed(machine, [Printed("chief", 7.0, 10), Exited("chief", 0, 10.0)])
    assert machine.handle(Tick(70.5)) == [Inspect(("worker0", "worker1"))]
    first = machine.handle(stacks("worker0", 71.0, "server_join"))
    assert first[0] == Say("worker0 serves: it waits in TensorFlow's Server.join() (Server.join (server_lib.py:185) ← "
                           "<module> (ps.py:4))")
    assert first[1].message.startswith("worker0 served: it never trained, and waits in TensorFlow's Server.join() now "
                                       "that the chief (chief) has succeeded: stopped as a parameter server is")
    assert "`servers: [ps, worker]`" in first[1].message and first[2:] == [Stop(("worker0",))]
    feed(machine, [stacks("worker1", 71.1, "server_join"), Exited("worker0", 143, 72.0, signal="SIGTERM",
                                                                  ended_by="stopped")])
    assert machine.handle(Exited("worker1", 143, 72.1, signal="SIGTERM", ended_by="stopped")) == [
        Stop(("ps0",)), Finish(0, "ok")]
    assert verdicts(machine) == {"ps0": "served", "chief": "ok", "worker0": "served", "worker1": "served"}


def test_the_timeout_stops_everything() -> None:
    machine = RunMachine(RunPlan(servers=("ps0",), finishers=("worker0",), chief="worker0", timeout_s=60))
    feed(machine, [Began(0.0), Serving("ps0", 2.0)])
    assert machine.handle(Tick(59.0)) == []
    assert machine.handle(Tick(61.0)) == [Inspect(("ps0", "worker0"))], "where each waits, read before they stop"
    assert machine.handle(stacks("ps0", 61.5, "server_join"))[1:] == []
    actions = machine.handle(stacks("worker0", 62.0, "own_retry_loop"))
    assert actions[1:] == [Stop(("ps0", "worker0")), Finish(1, "timeout", "the run passed its timeout of 60s")]
    assert verdicts(machine) == {"ps0": "timeout", "worker0": "timeout"}
    assert machine.nodes["worker0"].stack == fakeguard.stack("own_retry_loop")[1]
    lost = RunMachine(RunPlan(servers=(), finishers=("worker0",), chief="worker0", timeout_s=60))
    feed(lost, [Began(0.0), Tick(61.0)])
    assert feed(lost, [Tick(70.0)]) == [] and feed(lost, [Tick(82.0)])[-1] == Finish(
        1, "timeout", "the run passed its timeout of 60s"), "stacks that never come are waited for 20 s"


def test_an_interrupt_stops_everything_and_a_second_one_forces() -> None:
    machine = started()
    actions = machine.handle(Interrupt(12.0, "interrupted (Ctrl-C)"))
    assert actions == [Stop(("ps0", "worker0", "worker1", "worker2")),
                       Finish(130, "interrupted", "interrupted (Ctrl-C)")]
    assert set(verdicts(machine).values()) == {"interrupted"}
    machine.handle(Exited("worker0", 143, 12.5))
    assert machine.handle(Interrupt(13.0, "interrupted (Ctrl-C)", force=True)) == [
        Stop(("ps0", "worker1", "worker2"), force=True)]


def test_an_interrupt_while_the_servers_start_stops_the_held_workers_too() -> None:
    machine = RunMachine(PLAN)
    machine.handle(Began(0.0))
    actions = machine.handle(Interrupt(1.0, "the output pipe closed"))
    assert actions[0] == Stop(("ps0", "worker0", "worker1", "worker2"))


def test_the_evaluator_runs_beside_and_is_stopped_at_the_end() -> None:
    plan = RunPlan(servers=("ps0",), sidecars=("evaluator",), finishers=("worker0",), chief="worker0")
    machine = RunMachine(plan)
    assert machine.handle(Began(0.0))[0] == Start(("ps0", "evaluator"))
    machine.handle(Serving("ps0", 1.0))
    assert machine.handle(Exited("worker0", 0, 9.0)) == [Stop(("ps0", "evaluator")), Finish(0, "ok")]
    assert verdicts(machine) == {"ps0": "served", "evaluator": "stopped", "worker0": "ok"}


@pytest.mark.parametrize("code", [0, 1])
def test_events_of_unknown_nodes_and_repeated_exits_change_nothing(code: int) -> None:
    machine = started()
    assert machine.handle(Exited("nobody", code, 1.0)) == []
    machine.handle(Exited("worker1", 0, 9.0))
    assert machine.handle(Exited("worker1", code, 9.5)) == []
    assert machine.nodes["worker1"].verdict == "ok"


def test_an_oom_killed_worker_gets_the_verdict_oom_with_its_nodes_limit() -> None:
    plan = RunPlan(servers=("ps0",), finishers=("worker0", "worker1"), chief="worker0",
                   memory_limits={"ps0": "256M", "worker0": "256M", "worker1": "256M"})
    machine = started(plan)
    actions = feed(machine, [Exited("worker1", 137, 9.0, signal="SIGKILL", ended_by="oom")])
    problem = "worker1 ran out of memory: the kernel's out-of-memory killer ended it at its node's limit of 256M"
    assert Finish(1, "oom", problem) in actions
    assert Stop(("ps0", "worker0")) in actions
    assert machine.nodes["worker1"].verdict == "oom" and machine.nodes["worker0"].verdict == "stopped"


def test_a_plain_137_is_not_called_oom() -> None:
    machine = started()
    actions = feed(machine, [Exited("worker2", 137, 9.0, None)])
    assert machine.finish.verdict == "failed" and machine.nodes["worker2"].verdict == "failed"
    assert not [a for a in actions if isinstance(a, Finish) and "memory" in (a.problem or "")]


def test_the_chiefs_end_in_another_terminal_starts_the_grace_of_an_exec(
) -> None:
    from tflab.run.events import PeerEnded

    plan = RunPlan(servers=(), finishers=("worker1",), chief="worker0", grace_s=5.0, stop_hung=False)
    machine = RunMachine(plan)
    feed(machine, [Began(0.0), Printed("worker1", 1.0, 3)])
    assert feed(machine, [Tick(100.0)]) == [], "no chief's end, no hang"
    assert feed(machine, [PeerEnded("worker0", 0, 100.0)]) == [Say("the chief (worker0) has finished")]
    assert feed(machine, [Tick(106.0)]) == [Inspect(("worker1",))]
    said = feed(machine, [Stacks("worker1", 106.5, None, "py-spy is not in this node")])
    assert said == [Say("where worker1 waits could not be read: py-spy is not in this node"),
                    Say("worker1 still running 5s after the chief finished, silent for 6s (where it waits could not "
                        "be read): it looks hung (Ctrl-C stops it; with --grace tflab stops it)")]
    assert feed(machine, [Tick(120.0)]) == [], "said once"
    assert not machine.finished and machine.nodes["worker1"].running


def test_a_worker_in_tensorflows_teardown_after_the_chief_is_finished_not_hung() -> None:
    # A starved all-reduce worker: it trained every step with the others, and its runtime still called the
    # coordination service the chief ran after the chief had ended (seen in a real run at 0.1 CPU).
    machine = started()
    feed(machine, [Printed("worker2", 8.0, 300), Exited("worker0", 0, 10.0), Exited("worker1", 0, 10.0),
                   Printed("worker2", 11.0, leader_gone=True)])
    assert machine.handle(Tick(40.5)) == []
    actions = machine.handle(Tick(41.5))
    assert actions == [
        Say("worker2 finished training, then stayed 32s in TensorFlow's teardown, calling the coordination "
            "service that ended with worker0: stopped, and counted as finished (a cluster's job succeeds when "
            "its chief does)"),
        Stop(("worker2",)),
    ]
    assert machine.nodes["worker2"].verdict == "ok"
    assert machine.handle(Exited("worker2", 137, 42.0)) == [Stop(("ps0",)), Finish(0, "ok")]


def test_a_worker_that_never_trained_is_hung_whatever_its_runtime_logs() -> None:
    machine = started()
    feed(machine, [Printed("worker0", 7.0, 10), Exited("worker0", 0, 10.0), Exited("worker1", 0, 10.0),
                   Printed("worker2", 11.0, leader_gone=True)])
    assert machine.handle(Tick(71.0)) == [Inspect(("worker2",))]
    actions = machine.handle(stacks("worker2", 71.5, "tf1_session_wait"))
    assert actions[-1] == Stop(("worker2",)) and machine.nodes["worker2"].verdict == "hung"


def test_a_teardown_before_a_chief_that_failed_is_no_finish() -> None:
    machine = started()
    feed(machine, [Printed("worker2", 8.0, 30), Printed("worker2", 9.0, leader_gone=True), Exited("worker0", 1, 10.0)])
    assert machine.finish is not None and machine.finish.verdict == "failed"


def test_a_run_tflab_down_stops_is_recorded_stopped_and_one_ctrl_c_ends_interrupted() -> None:
    from tflab.host.signals import DOWN_REASON

    machine = started()
    assert machine.handle(Interrupt(12.0, DOWN_REASON))[-1] == Finish(130, "stopped", "stopped by `tflab down`")
    assert verdicts(machine) == {"ps0": "stopped", "worker0": "stopped", "worker1": "stopped", "worker2": "stopped"}
    other = started()
    assert other.handle(Interrupt(12.0, "interrupted (Ctrl-C)"))[-1].verdict == "interrupted"
