"""What limited a run, from literal figures: each kind on its own case, and the host blamed only when it is at fault."""

from __future__ import annotations

import pytest

from tflab.engine.metrics import NodeFigures
from tflab.run.bottleneck import Limit, Series, Shape, find

NODES = ("ps0", "worker0", "worker1", "worker2")


def shape(cpus: float | None = 0.5, host_cpus: int = 2, link_mbit: float | None = None, **own) -> Shape:
    return Shape(servers=("ps0",), workers=("worker0", "worker1", "worker2"),
                 cpus={n: own.get(n, cpus) for n in NODES}, host_cpus=host_cpus, link_mbit=link_mbit)


def series(busy: dict[str, float], host: float = 0.5, samples: int = 10, memory: dict[str, float] | None = None,
           rx: dict[str, float] | None = None, tx: dict[str, float] | None = None,
           owned: float | dict[str, float] = 0.5, throttled: dict[str, float] | None = None) -> Series:
    """`owned`: the CPUs each node's cgroup says it owns (a `fault cpu` changes it from the design's)."""
    mine = owned if isinstance(owned, dict) else {n: owned for n in NODES}
    out = Series()
    for _ in range(samples):
        out.add(host, [NodeFigures(node=n, t=0.0, cpu_used=busy.get(n, 0.1) * mine.get(n, 0.5),
                                   cpu_owned=mine.get(n, 0.5), throttled=(throttled or {}).get(n, 0.0),
                                   memory_mb=(memory or {}).get(n, 0.2) * 1000, memory_limit_mb=1000.0,
                                   rx_mbit=(rx or {}).get(n, 1.0), tx_mbit=(tx or {}).get(n, 1.0)) for n in NODES])
    return out


def test_a_starved_parameter_server_is_the_limit() -> None:
    found = find(series({"ps0": 0.96, "worker0": 0.4, "worker1": 0.42, "worker2": 0.38}, host=0.95), shape())
    assert found == Limit("ps-cpu", "ps0 at 96% of its 0.5 CPU; workers at 40% of theirs")
    assert found.sentence() == "what limited this run: ps-cpu: ps0 at 96% of its 0.5 CPU; workers at 40% of theirs"


def test_a_parameter_server_held_back_at_its_quota_is_at_its_share() -> None:
    # the demo's run: ps0 used 82% of its 0.5 CPU on average, its quota holding it back in 47% of its periods
    found = find(series({"ps0": 0.82, "worker0": 0.5, "worker1": 0.52, "worker2": 0.48}, throttled={"ps0": 0.47}),
                 shape())
    assert found == Limit("ps-cpu", "ps0 at 82% of its 0.5 CPU (held back at its quota in 47% of its periods); "
                                    "workers at 50% of theirs")


def test_a_node_busy_at_its_own_share_on_a_busy_host_is_the_design_not_the_host() -> None:
    # the demo's case: four 0.5-CPU nodes on 2 CPUs, the host busy, the shares fitting it
    found = find(series({"ps0": 0.9, "worker0": 0.6, "worker1": 0.6, "worker2": 0.6}, host=0.97), shape())
    assert found.kind == "ps-cpu" and "host" not in found.evidence


def test_a_host_busy_with_work_outside_the_lab_is_the_limit_naming_the_share_others_took() -> None:
    """The nodes' shares fit the host, yet none reaches its share: the host's CPUs are saturated, by 1.4 CPUs of work
    that is not the lab's (2 CPUs 95% busy, the nodes using 0.5 of their 2)."""
    starved = {"ps0": 0.25, "worker0": 0.25, "worker1": 0.25, "worker2": 0.25}
    found = find(series(starved, host=0.95), shape())
    assert found == Limit("host", "the host's 2 CPUs were at least 90% busy in 100% of the training, and work outside "
                                  "the lab's nodes took about 1.4 of them (70%; the nodes used 0.5): no node could use "
                                  "its share, and its steps/s are this host's, not a cluster's of this shape")
    idle = find(series(starved, host=0.3), shape())
    assert idle.kind == "none", "a host with room: the program's own waits"
    own = find(series({"ps0": 0.9, "worker0": 0.25, "worker1": 0.25, "worker2": 0.25}, host=0.95), shape())
    assert own.kind == "ps-cpu", "a node at its share is the design's limit, whatever else the host does"


def test_one_worker_alone_at_its_share_is_the_straggler() -> None:
    # the design gave every node 0.5 CPU; `tflab fault cpu worker1 0.1` took worker1's down at run time
    found = find(series({"ps0": 0.3, "worker0": 0.45, "worker1": 0.97, "worker2": 0.44}, owned={"worker1": 0.1}),
                 shape())
    assert found == Limit("worker-cpu", "worker1 at 97% of its 0.1 CPU, the other workers at 45% of theirs: "
                                        "worker1 is the straggler")


def test_workers_all_at_their_share() -> None:
    found = find(series({"ps0": 0.3, "worker0": 0.95, "worker1": 0.93, "worker2": 0.91}), shape())
    assert found == Limit("worker-cpu", "worker0, worker1, worker2 at 93% of their CPU shares (ps0 at 30%)")


@pytest.mark.parametrize(("cpus", "own", "why"), [
    (None, {}, "ps0, worker0, worker1, worker2 have no CPU share of their own"),
    (1.0, {}, "the nodes' shares add up to 4 CPUs of its 2"),
])
def test_the_host_is_blamed_only_when_the_shares_oversubscribe_it_or_are_unset(cpus, own, why) -> None:
    busy = {"ps0": 0.9, "worker0": 0.9, "worker1": 0.9, "worker2": 0.9}
    found = find(series(busy, host=0.98, owned=2.0 if cpus is None else cpus), shape(cpus, **own))
    assert found.kind == "host" and why in found.evidence, found
    assert found.evidence.startswith("the host's 2 CPUs were at least 90% busy in 100% of the training")


def test_a_link_near_its_rate() -> None:
    found = find(series({"ps0": 0.3}, rx={"ps0": 4.7}, tx={"worker1": 4.1}), shape(link_mbit=5.0))
    assert found == Limit("link", "ps0 received 4.7 Mbit/s on its 5 Mbit/s link (94%, its busiest quarter)")
    assert find(series({"ps0": 0.3}, rx={"ps0": 4.7}), shape()).kind == "none", "no shaped link: no link limit"


def test_memory_near_a_limit_comes_first() -> None:
    found = find(series({"ps0": 0.96}, memory={"worker2": 0.93}), shape())
    assert found == Limit("memory", "worker2's memory reached 93% of its 1000M limit")


def test_nothing_at_a_limit_says_so() -> None:
    found = find(series({"ps0": 0.3, "worker0": 0.5, "worker1": 0.5, "worker2": 0.5}), shape())
    assert found.kind == "none" and found.evidence.startswith("the busiest node, worker0, used 50% of its 0.5 CPU")
    assert find(Series(), shape()) == Limit("none", "too few figures of the training to tell "
                                                    "(0 snapshots from its first step to its end)")
    short = series({"ps0": 0.3}, samples=2)
    assert find(short, shape()).evidence == "too few figures of the training to tell (2 snapshots from its first " \
                                            "step to its end)"


def test_nodes_without_shares_on_a_host_with_room_name_the_busiest_and_the_hosts_room() -> None:
    """Not 'too few figures': the figures are there, and say the host was not the limit."""
    busy = {"ps0": 0.1, "worker0": 0.45, "worker1": 0.4, "worker2": 0.4}
    found = find(series(busy, host=0.6, owned=2.0), shape(None))
    assert found == Limit("none", "the busiest node, worker0, used 45% of the host's CPUs; the host's 2 CPUs had "
                                  "room (at least 90% busy in 0% of the training); no link or memory near its limit: "
                                  "the program's own waits set the pace")


def waiting(series_: Series, share: float) -> Series:
    """The same figures, with some task waiting for a CPU `share` of each interval (the kernel's CPU pressure)."""
    series_.host_waiting = [share] * len(series_.host_busy)
    return series_


def test_tasks_waiting_on_an_idle_looking_host_blame_it_where_no_node_has_a_quota() -> None:
    """A CPU quota or cpuset above tflab (a container's, a CI runner's) leaves the host's CPUs idle while the lab's
    tasks wait: the kernel's CPU pressure says so. Half of four CPUs busy, tasks waiting 80% of the time."""
    busy = {"ps0": 0.5, "worker0": 0.5, "worker1": 0.5, "worker2": 0.5}
    found = find(waiting(series(busy, host=0.5, owned=4.0), 0.8), shape(None, host_cpus=4))
    assert found == Limit("host", "some task waited for a CPU 50% of the time or more (or the CPUs were saturated) in "
                                  "100% of the training, while the host's 4 CPUs were 50% busy on average: something "
                                  "above tflab (a CPU quota or cpuset) gives the lab fewer CPUs than the host has, and "
                                  "ps0, worker0, worker1, worker2 have no CPU share of their own: its steps/s are this "
                                  "host's, not a cluster's of this shape")
    assert find(waiting(series(busy, host=0.5, owned=4.0), 0.3), shape(None, host_cpus=4)).kind == "none", \
        "tasks waiting 30% of the time: the host had room enough"
    # A node given a quota during the run (`tflab fault cpu worker1 0.2`) waits on it: no blame for the host.
    faulted = waiting(series(busy, host=0.5, owned=4.0, throttled={"worker1": 0.8}), 0.8)
    assert find(faulted, shape(None, host_cpus=4)).kind != "host"
    # Nodes with quotas wait on their own quotas: a wait then says nothing of the host.
    shared = find(waiting(series({"ps0": 0.96, "worker0": 0.4, "worker1": 0.42, "worker2": 0.38}, host=0.5), 0.8),
                  shape())
    assert shared.kind == "ps-cpu", shared


def test_the_kernels_cpu_pressure_is_read_as_seconds_some_task_waited(tmp_path) -> None:
    from tflab.host import hardware

    pressure = tmp_path / "cpu"
    pressure.write_text("some avg10=0.18 avg60=12.86 avg300=9.79 total=44827671\n"
                        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")  # as this machine's kernel writes it
    assert hardware.cpu_pressure(pressure) == 44.827671
    assert hardware.cpu_pressure(tmp_path / "none") is None, "a kernel without pressure stall information"
    pressure.write_text("some avg10=0.18\n")
    assert hardware.cpu_pressure(pressure) is None

def test_a_run_watch_counts_only_the_training_and_names_its_limit(tmp_path) -> None:
    """run/cluster.py: snapshots before the first step (imports) are not the design's; after it they are."""
    from tflab.engine.metrics import Snapshot
    from tflab.plan.topology import Topology, plan
    from tflab.run.cluster import ClusterWatch
    from tflab.run.events import Began, Printed, Serving
    from tflab.run.runplan import RunPlan
    from tflab.run.machine import RunMachine

    from tflab.plan.shares import HostFacts

    lab = plan(Topology(nodes=4, cpus_per_node="0.5"), [], HostFacts(cpus=(0, 1), numa_cpus={0: (0, 1)},
                                                                     memory_mib=8192))
    machine = RunMachine(RunPlan(servers=("ps0",), finishers=("worker0", "worker1", "worker2"), chief="worker0"))
    machine.handle(Began(0.0))
    machine.handle(Serving("ps0", 1.0))
    watch = ClusterWatch(executor=None, lab=lab, folder=tmp_path, machine=machine, host_cpus=2, board=False)

    def snap(t: float, ps: float) -> Snapshot:
        return Snapshot(t, {n: NodeFigures(node=n, t=t, cpu_used=(ps if n == "ps0" else 0.2) * 0.5, cpu_owned=0.5)
                            for n in NODES}, host_busy=0.6)

    for t in range(5):
        watch._snapshot(snap(float(t), 0.1))  # importing: no step yet
    machine.handle(Printed("worker0", 5.0, 1))
    for t in range(5, 10):
        watch._snapshot(snap(float(t), 0.97))
    assert watch.stop() == Limit("ps-cpu", "ps0 at 97% of its 0.5 CPU; workers at 20% of theirs")


def test_the_sampler_gives_each_snapshot_the_share_of_its_interval_some_task_waited(monkeypatch) -> None:
    """engine/metrics.py: the pressure's total grows 0.75 s a second here, the host's CPUs look half busy."""
    import threading
    import time

    from tflab.engine.metrics import ClusterSampler
    from tflab.host import hardware

    jiffies = iter(range(0, 10**6, 100))
    monkeypatch.setattr(hardware, "cpu_times", lambda: (next(jiffies) / 2, next(jiffies)))
    monkeypatch.setattr(hardware, "cpu_pressure", lambda: time.monotonic() * 0.75)
    seen, enough = [], threading.Event()

    def on_snapshot(snap) -> None:
        seen.append(snap)
        if len(seen) >= 4:
            enough.set()

    sampler = ClusterSampler(executor=None, nodes=[], host_cpus=2, every_s=0.05, on_snapshot=on_snapshot).start()
    try:
        assert enough.wait(10)
    finally:
        sampler.close()
    assert seen[0].host_waiting is None, "one reading gives no interval"
    assert all(s.host_waiting == pytest.approx(0.75, abs=0.01) for s in seen[1:4]), [s.host_waiting for s in seen]
    assert all(s.host_busy == pytest.approx(0.5, abs=0.01) for s in seen[1:4]), [s.host_busy for s in seen]
