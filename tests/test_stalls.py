"""No run waits in silence: the stall rule from literal events (issue 54), and what a stalled cluster's look says.

The rule: finishers that printed no step, and no node of the run that printed a line of its own or used more
than a sliver of a CPU for --stall seconds (the cluster's figures covering that time), make the run `stalled`.
A program that computes or prints is never stalled: a slow import, a slow data loader, a ps that only serves
beside workers that compute.
"""

from __future__ import annotations

from tflab.run import stalls
import fakeguard

from tflab.run.events import Began, Busy, Check, Finish, Inspect, Printed, Say, Serving, Stacks, Stop, Tick
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan

ALLREDUCE = RunPlan(servers=(), finishers=("worker0", "worker1"), chief="worker0", stall_s=120.0)
PS = RunPlan(servers=("ps0",), finishers=("worker0", "worker1"), chief="worker0", stall_s=120.0)
IDLE = 0.004  # CPUs' worth: what an idle node (its guard, its metrics reader, a waiting TensorFlow) uses
BUSY = 0.45


def figures(t: float, **cpu: float) -> Busy:
    return Busy(t, tuple(cpu.items()))


def run(plan: RunPlan, until: float, cpu: dict[str, float], extra: list | None = None) -> tuple[RunMachine, list]:
    """A run released at 0 (servers serving at 2), the nodes' figures every 2 s until `until`, ticks between."""
    machine = RunMachine(plan)
    actions = machine.handle(Began(0.0))
    if plan.servers:
        actions += machine.handle(Serving("ps0", 2.0))
    events = sorted([*(extra or []), *(e for t in range(2, int(until) + 1, 2)
                                       for e in (figures(float(t), **cpu), Tick(float(t) + 0.5)))],
                    key=lambda event: event.t)
    for event in events:
        actions += machine.handle(event)
    return machine, actions


def test_workers_that_never_join_and_a_cluster_that_does_nothing_make_the_run_stalled() -> None:
    dump = fakeguard.stack("own_retry_loop")[1]
    machine, actions = run(ALLREDUCE, 130.0, {"worker0": IDLE, "worker1": IDLE},
                           extra=[Stacks("worker0", 123.0, dump), Stacks("worker1", 123.1, dump)])
    assert Check(("worker0", "worker1"), ("worker0", "worker1")) in actions
    assert actions.index(Check(("worker0", "worker1"), ("worker0", "worker1"))) < actions.index(
        Stop(("worker0", "worker1"))), "the look at the cluster comes before the stop"
    assert actions.index(Inspect(("worker0", "worker1"))) < actions.index(Stop(("worker0", "worker1"))), \
        "and where each waits (its stacks)"
    assert Say("worker1 waits in the program's own code: with_retries.<locals>.wrap.<locals>.wrapped (retry.py:9) ← "
               "main (retry.py:19)") in actions
    assert machine.nodes["worker1"].stack == dump
    finish = next(a for a in actions if isinstance(a, Finish))
    assert finish == Finish(1, "stalled", "the run is stalled: worker0, worker1 printed no step, and no node of it "
                                          "printed a line or used the CPU for 120s (--stall): they wait for something "
                                          "that does not come")
    assert {n: node.verdict for n, node in machine.nodes.items()} == {"worker0": "stalled", "worker1": "stalled"}


def test_the_stall_comes_no_sooner_than_its_seconds_and_never_when_switched_off() -> None:
    _, before = run(ALLREDUCE, 118.0, {"worker0": IDLE, "worker1": IDLE})
    assert not any(isinstance(a, Finish) for a in before)
    off = RunPlan(servers=(), finishers=("worker0", "worker1"), chief="worker0", stall_s=0.0)
    _, never = run(off, 400.0, {"worker0": IDLE, "worker1": IDLE})
    assert not any(isinstance(a, Finish) for a in never)


def test_without_the_clusters_figures_nothing_is_called_stalled() -> None:
    """`--no-metrics`, or figures that stopped coming: tflab cannot tell a stall from work, so it does not."""
    machine = RunMachine(ALLREDUCE)
    actions = machine.handle(Began(0.0)) + [a for t in range(1, 400) for a in machine.handle(Tick(float(t)))]
    assert not any(isinstance(a, Finish) for a in actions)
    _, late = run(ALLREDUCE, 60.0, {"worker0": IDLE, "worker1": IDLE},
                  extra=[Tick(float(t)) for t in range(61, 300)])
    assert not any(isinstance(a, Finish) for a in late), "figures last heard at 60 s say nothing of 61 to 300"


def test_a_slow_import_or_data_loader_computes_and_is_never_stalled() -> None:
    """A node held to a sliver of a CPU imports TensorFlow for minutes; a loader decodes its data for minutes: both
    use the CPU and print nothing."""
    machine, actions = run(ALLREDUCE, 400.0, {"worker0": BUSY, "worker1": IDLE})
    assert not any(isinstance(a, Finish) for a in actions)
    assert machine.nodes["worker1"].verdict == "running", "one that waits for a peer that computes waits rightly"


def test_a_program_that_prints_is_never_stalled_but_tensorflows_own_retries_are_no_sign_of_life() -> None:
    said = [Printed("worker0", float(t), step=None) for t in range(50, 400, 60)]
    _, actions = run(ALLREDUCE, 400.0, {"worker0": IDLE, "worker1": IDLE}, extra=said)
    assert not any(isinstance(a, Finish) for a in actions), "it prints: it goes on (a slow loader saying its files)"
    retries = [Printed("worker0", float(t), runtime=True) for t in range(50, 400, 20)]
    _, actions = run(ALLREDUCE, 160.0, {"worker0": IDLE, "worker1": IDLE}, extra=retries)
    assert any(isinstance(a, Finish) and a.verdict == "stalled" for a in actions), \
        "gRPC's connection errors, logged by TensorFlow again and again, are the wait itself"


def test_a_ps_that_only_serves_beside_workers_that_compute_is_no_stall() -> None:
    """ParameterServerStrategy: the chief prints only at the end of an epoch and uses little CPU; the workers (which
    only serve) compute its steps; the ps waits on them."""
    plan = RunPlan(servers=("ps0", "worker0", "worker1"), finishers=("chief",), chief="chief", stall_s=120.0)
    machine = RunMachine(plan)
    actions = machine.handle(Began(0.0))
    for server in plan.servers:
        actions += machine.handle(Serving(server, 2.0))
    for t in range(4, 400, 2):
        actions += machine.handle(figures(float(t), ps0=IDLE, worker0=BUSY, worker1=BUSY, chief=0.02))
        actions += machine.handle(Tick(t + 0.5))
    assert not any(isinstance(a, Finish) for a in actions)


def test_a_worker_that_trained_is_not_named_but_one_that_never_joined_is() -> None:
    """An asynchronous ps training: worker1 trained, then everything went quiet with worker0 never joined."""
    machine, actions = run(PS, 300.0, {"ps0": IDLE, "worker0": IDLE, "worker1": IDLE},
                           extra=[Printed("worker1", 10.0, step=5)])
    finish = next(a for a in actions if isinstance(a, Finish))
    assert finish.verdict == "stalled" and "worker0 printed no step" in (finish.problem or "")
    assert machine.nodes["worker0"].verdict == "stalled" and machine.nodes["worker1"].verdict == "stopped"


# -- what the look at a stalled cluster says -------------------------------------------------------------------------

def test_a_node_whose_port_answers_from_nowhere_never_joined() -> None:
    looks = {
        "worker0": stalls.read_look("worker0", "reach worker1 4\n"),
        "worker1": stalls.read_look("worker1", "reach worker0 0\n"),
    }
    found = stalls.findings(["worker0", "worker1"], looks)
    assert found.said == [
        "worker1 never joined: no node reaches worker1:2222 (its program has not started its TensorFlow server: look "
        "at what it does before that)",
        "worker0 waits for worker1", "worker1 has not started its TensorFlow server"]
    assert found.diagnosis["id"] == "stall-never-joined"
    assert found.record["never_joined"] == ["worker1"]


def test_a_proxy_on_the_way_is_named_with_the_variable_that_sends_the_connections_there() -> None:
    """Every port answers (a connection made directly), but the programs' environment sends gRPC to a proxy: the
    Docker client's proxies, and a run's --env that took NO_PROXY out."""
    env = "env http_proxy=http://127.0.0.1:3128\nenv HTTP_PROXY=http://127.0.0.1:3128\nenv no_proxy=a,b\n"
    looks = {name: stalls.read_look(name, f"reach {peer} 0\n{env}", {"NO_PROXY": "", "no_proxy": ""})
             for name, peer in (("worker0", "worker1"), ("worker1", "worker0"))}
    found = stalls.findings(["worker0", "worker1"], looks)
    assert found.said[0] == ("worker0's programs send their connections to worker1 through the proxy "
                             "http://127.0.0.1:3128 (its http_proxy), which cannot reach the lab's nodes: its no_proxy "
                             "does not name them")
    assert found.diagnosis["id"] == "stall-proxy"
    assert found.record["proxied"] == {"worker0": {"worker1": "http://127.0.0.1:3128"},
                                       "worker1": {"worker0": "http://127.0.0.1:3128"}}


def test_gRPCs_own_reading_of_the_proxy_variables() -> None:
    assert stalls.proxy_for({"http_proxy": "p"}, "worker1") == ("http_proxy", "p")
    assert stalls.proxy_for({"https_proxy": "s", "http_proxy": "p"}, "worker1") == ("https_proxy", "s")
    assert stalls.proxy_for({"HTTP_PROXY": "p"}, "worker1") is None, "gRPC reads the lower-case ones"
    assert stalls.proxy_for({"http_proxy": "p", "no_proxy": "pypi.corp,worker1,localhost"}, "worker1") is None
    assert stalls.proxy_for({"http_proxy": "p", "no_proxy": ".svc"}, "job-worker-0.default.svc") is None
    assert stalls.proxy_for({"http_proxy": "p", "no_proxy": "*"}, "worker1") is None
    assert stalls.proxy_for({"http_proxy": "p", "no_grpc_proxy": "", "no_proxy": "worker1"}, "worker1") == \
        ("http_proxy", "p"), "no_grpc_proxy, where set, is read instead of no_proxy"


def test_a_cluster_that_reaches_itself_directly_gets_no_guessed_cause() -> None:
    looks = {"worker0": stalls.read_look("worker0", "reach worker1 0\n"),
             "worker1": stalls.read_look("worker1", "reach worker0 0\n")}
    found = stalls.findings(["worker0", "worker1"], looks)
    assert found.said[0].startswith("every node reaches every other node's TensorFlow port directly")
    assert found.diagnosis["id"] == "stall-waiting" and found.diagnosis["cure"] == ""
