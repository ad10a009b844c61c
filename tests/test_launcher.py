"""The run's order and its process handling, without an engine."""

from __future__ import annotations

import subprocess
import time

from tflab.config import Task
from tflab.launcher import NodeRun, start_order, stop_script, succeeded, wrapped
from tflab.model import Topology, plan


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_parameter_servers_first_then_workers() -> None:
    lab = plan(Topology(nodes=4), [])
    servers, finishers = start_order(lab, Task("train", "x"))
    assert names(servers) == ["ps0"] and names(finishers) == ["worker0", "worker1", "worker2"]


def test_ps_strategy_serves_ps_and_workers_and_finishes_with_the_chief() -> None:
    lab = plan(Topology(nodes=3, chief=True, evaluator=True), [])
    servers, finishers = start_order(lab, Task("pss", "x", ("ps", "worker")))
    assert names(servers) == ["ps0", "worker0", "worker1", "evaluator"]
    assert names(finishers) == ["chief"]


def test_all_reduce_lab_has_no_servers() -> None:
    servers, finishers = start_order(plan(Topology(nodes=3, ps=0), []), Task("a", "x"))
    assert servers == [] and names(finishers) == ["worker0", "worker1", "worker2"]


def test_stop_script_ends_a_whole_group_that_ignores_sigterm(tmp_path) -> None:
    # The same shell lines tflab runs in a node, here on the host's sh (dash on Debian).
    pid_dir = tmp_path / "pids"
    argv = wrapped("r1", "ps0", ["sh", "-c", "trap '' TERM; sleep 300 & trap '' TERM; wait"])
    argv[2] = argv[2].replace("/run/tflab", str(pid_dir))
    child = subprocess.Popen(argv, start_new_session=True)
    for _ in range(50):
        if (pid_dir / "r1-ps0.pid").exists():
            break
        time.sleep(0.1)
    stop = stop_script("r1", "ps0", 0.5)
    stop[2] = stop[2].replace("/run/tflab", str(pid_dir))
    started = time.monotonic()
    subprocess.run(stop, check=True, timeout=20)
    assert child.wait(timeout=10) == -9
    assert time.monotonic() - started < 5
    assert not (pid_dir / "r1-ps0.pid").exists()


def test_success_needs_every_finisher_ok() -> None:
    lab = plan(Topology(nodes=3), [])
    ps, w0, w1 = lab.nodes
    runs = [NodeRun(ps, "server", [], verdict="served"), NodeRun(w0, "finisher", [], verdict="ok"),
            NodeRun(w1, "finisher", [], verdict="ok")]
    assert succeeded(runs)
    runs[2].verdict = "hung"
    assert not succeeded(runs)
    assert not succeeded([runs[0]])
