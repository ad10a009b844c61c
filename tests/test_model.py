"""The pure plan: roles, GPU blocks, ports and TF_CONFIG, against literal expected values."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tflab.errors import UserError
from tflab.plan.gpus import Gpu
from tflab.plan.topology import Topology, gpu_blocks, memory_fractions, plan, roles

EIGHT = [Gpu(index=i, memory_mib=81559) for i in range(8)]


def test_reference_case_eight_gpus_four_nodes_of_two() -> None:
    lab = plan(Topology(nodes=4, gpus_per_node=2), EIGHT)
    assert [(n.name, n.job, n.task_index, n.gpus) for n in lab.nodes] == [
        ("ps0", "ps", 0, (0, 1)),
        ("worker0", "worker", 0, (2, 3)),
        ("worker1", "worker", 1, (4, 5)),
        ("worker2", "worker", 2, (6, 7)),
    ]
    assert [(n.ssh_port, n.tensorboard_port) for n in lab.nodes] == [
        (20022, 26006), (20023, 26007), (20024, 26008), (20025, 26009),
    ]
    assert lab.chief.name == "worker0"


def test_environment_of_worker1_matches_design() -> None:
    lab = plan(Topology(nodes=4, gpus_per_node=2), EIGHT)
    env = lab.node("worker1").env
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert env["TF_CONFIG"] == (
        '{"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]}, '
        '"task": {"type": "worker", "index": 1}}'
    )
    assert {k: v for k, v in env.items() if k != "TF_CONFIG"} == {
        "TFLAB_NODE": "worker1",
        "TFLAB_JOB_NAME": "worker",
        "TFLAB_TASK_INDEX": "1",
        "TFLAB_PS_HOSTS": "ps0:2222",
        "TFLAB_WORKER_HOSTS": "worker0:2222,worker1:2222,worker2:2222",
        "TFLAB_NUM_GPUS": "2",
        "PYTHONUNBUFFERED": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def test_ps_zero_is_all_workers_and_cpu_lab_has_no_gpus() -> None:
    lab = plan(Topology(nodes=3, ps=0), [])
    assert lab.names == ["worker0", "worker1", "worker2"]
    assert lab.cluster == {"worker": ["worker0:2222", "worker1:2222", "worker2:2222"]}
    assert all(n.gpus == () and n.env["TFLAB_NUM_GPUS"] == "0" for n in lab.nodes)


def test_chief_and_evaluator_are_added_after_ps_and_workers() -> None:
    lab = plan(Topology(nodes=3, chief=True, evaluator=True), [])
    assert lab.names == ["ps0", "worker0", "worker1", "chief", "evaluator"]
    assert lab.cluster == {
        "chief": ["chief:2222"], "ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222"],
    }
    assert lab.chief.name == "chief"
    assert json.loads(lab.node("chief").env["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
    assert json.loads(lab.node("evaluator").env["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    assert lab.node("worker0").env["TFLAB_CHIEF_HOST"] == "chief:2222"


def test_one_node_defaults_to_no_ps() -> None:
    assert roles(Topology(nodes=1)) == [("worker", 0)]


def test_explicit_gpu_list_is_split_in_listed_order() -> None:
    assert gpu_blocks([0, 1, 4, 5], 2, 2) == [(0, 1), (4, 5)]


def test_too_many_gpus_says_how_many_there_are() -> None:
    with pytest.raises(UserError, match=r"needs 10 GPUs .* the host has 8; .*--share-gpus"):
        gpu_blocks(list(range(8)), 5, 2)


def test_sharing_wraps_and_gives_each_node_a_memory_share() -> None:
    lab = plan(Topology(nodes=4, gpus_per_node=1, share_gpus=True), [Gpu(0, memory_mib=81559), Gpu(1, memory_mib=81559)])
    assert [n.gpus for n in lab.nodes] == [(0,), (1,), (0,), (1,)]
    assert [n.gpu_memory_fraction for n in lab.nodes] == [0.5] * 4
    assert lab.node("ps0").env["TFLAB_GPU_MEMORY_FRACTION"] == "0.50"
    assert lab.node("ps0").env["TFLAB_GPU_MEMORY_MB"] == "40779"
    assert memory_fractions([(0,), (0,), (0,)]) == [0.33, 0.33, 0.33]
    assert memory_fractions([(0,), (1,)]) == [None, None]


@pytest.mark.parametrize(
    ("topology", "message"),
    [
        (Topology(nodes=0), "--nodes must be at least 1"),
        (Topology(nodes=-2), "--nodes must be at least 1"),
        (Topology(nodes=2, ps=2), "--ps 2 leaves no worker"),
        (Topology(nodes=2, ps=-1), "--ps cannot be negative"),
        (Topology(nodes=2, gpus_per_node=-1), "--gpus-per-node cannot be negative"),
        (Topology(nodes=4, ssh_port_base=65533), "runs to port 65536, past 65535"),
        (Topology(nodes=4, ssh_port_base=26004), "ranges overlap"),
    ],
)
def test_bad_topologies_are_refused(topology: Topology, message: str) -> None:
    with pytest.raises(UserError, match=message):
        plan(topology, [])


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.integers(1, 24),
    ps=st.one_of(st.none(), st.integers(0, 6)),
    chief=st.booleans(),
    evaluator=st.booleans(),
    per_node=st.integers(0, 4),
    host_gpus=st.integers(0, 16),
    share=st.booleans(),
    ssh_base=st.integers(1024, 65535),
)
def test_any_accepted_topology_is_consistent(
    nodes: int, ps: int | None, chief: bool, evaluator: bool, per_node: int, host_gpus: int,
    share: bool, ssh_base: int,
) -> None:
    topology = Topology(
        nodes=nodes, ps=ps, chief=chief, evaluator=evaluator, gpus_per_node=per_node,
        share_gpus=share, ssh_port_base=ssh_base, tensorboard_port_base=ssh_base - 500,
    )
    # An oracle written apart from the model: is this topology one tflab must accept?
    ps_count = ps if ps is not None else (1 if nodes >= 2 else 0)
    total = nodes + chief + evaluator
    ports_fit = ssh_base + total - 1 <= 65535 and ssh_base - 500 >= 1 and total <= 500
    gpus_fit = per_node == 0 or (host_gpus > 0 and per_node <= host_gpus and (share or total * per_node <= host_gpus))
    acceptable = ps_count < nodes and ports_fit and gpus_fit
    host = [Gpu(i) for i in range(host_gpus)]
    if not acceptable:
        with pytest.raises(UserError):
            plan(topology, host)
        return
    lab = plan(topology, host)
    # Disjoint GPU blocks unless sharing was asked for.
    owned = [g for n in lab.nodes for g in n.gpus]
    if not share:
        assert len(owned) == len(set(owned))
    assert all(len(n.gpus) == per_node for n in lab.nodes)
    assert len(lab.nodes) == total and sum(n.job == "ps" for n in lab.nodes) == ps_count
    # Unique ports, all valid.
    used = [n.ssh_port for n in lab.nodes] + [n.tensorboard_port for n in lab.nodes]
    assert len(used) == len(set(used)) and all(0 < p <= 65535 for p in used)
    # TF_CONFIG's cluster lists every node once (the evaluator stands outside it, as in TF).
    for node in lab.nodes:
        cluster = json.loads(node.env["TF_CONFIG"])["cluster"]
        listed = [h.split(":")[0] for hosts in cluster.values() for h in hosts]
        assert sorted(listed) == sorted(n.name for n in lab.nodes if n.job != "evaluator")
    assert len(set(lab.names)) == len(lab.names)
