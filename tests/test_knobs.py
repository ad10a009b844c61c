"""Run-time knobs, without an engine: the lab a run sees, its commands, its environment, its words."""

from __future__ import annotations

import json

import pytest

from tflab.errors import UserError
from tflab.plan import knobs, tasks
from tflab.plan.config import Task
from tflab.plan.shares import HostFacts
from tflab.plan.topology import Topology, plan

CLASSIC = Task("train", "python t.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
                        "--worker_hosts={worker_hosts} --batch={BATCH} --keep=${BATCH}")


def test_two_of_three_workers_make_the_cluster_everyone_in_it_sees() -> None:
    lab = plan(Topology(nodes=4), [])  # ps0, worker0..2
    run = knobs.run_lab(lab, knobs.parse(lab, 2, workers="2"))
    assert run.names == ["ps0", "worker0", "worker1"]
    for node in run.nodes:
        config = json.loads(node.env["TF_CONFIG"])
        assert config["cluster"] == {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222"]}
        assert config["task"] == {"type": node.job, "index": node.task_index}
        assert node.env["TFLAB_WORKER_HOSTS"] == "worker0:2222,worker1:2222"
    line = tasks.command_line(run, "worker1", CLASSIC)
    assert "--worker_hosts=worker0:2222,worker1:2222 " in line and "--task_index=1" in line
    # what the processes get beside the node's own: only what changed
    changes = knobs.env_changes(lab, run, knobs.Knobs(workers=2))
    assert set(changes["worker0"]) == {"TF_CONFIG", "TFLAB_WORKER_HOSTS"}


def test_a_chief_lab_may_run_with_no_workers_and_others_need_one() -> None:
    chief_lab = plan(Topology(nodes=3, chief=True), [])
    run = knobs.run_lab(chief_lab, knobs.parse(chief_lab, 2, workers=0))
    assert run.names == ["ps0", "chief"] and "worker" not in json.loads(run.nodes[1].env["TF_CONFIG"])["cluster"]
    with pytest.raises(UserError, match="--workers 0: this lab has 3 workers, so a run can use 1 to 3"):
        knobs.parse(plan(Topology(nodes=4), []), 2, workers=0)


def test_env_knobs_fill_their_placeholders_and_leave_the_shells_own() -> None:
    lab = plan(Topology(nodes=2), [])
    chosen = knobs.parse(lab, 2, env=["BATCH=64", "MODE=a b"])
    line = knobs.fill_env(tasks.command_line(lab, "worker0", CLASSIC), chosen.env)
    assert "--batch=64 --keep=${BATCH}" in line
    assert knobs.env_changes(lab, knobs.run_lab(lab, chosen), chosen)["ps0"] == {"BATCH": "64", "MODE": "a b"}
    # without the knob, the braces stay as written (they are the program's business)
    assert "--batch={BATCH}" in tasks.command_line(lab, "worker0", CLASSIC)


def test_a_cpu_share_is_what_the_node_owns_for_the_run() -> None:
    lab = plan(Topology(nodes=3, cpus_per_node="0.5"), [], HostFacts(cpus=(0, 1, 2, 3), memory_mib=8192))
    chosen = knobs.parse(lab, 4, cpus=["0.5", "worker1=2"])
    run = knobs.run_lab(lab, chosen)
    assert {n.name: n.share.cpus for n in run.nodes} == {"ps0": 0.5, "worker0": 0.5, "worker1": 2.0}
    assert run.node("worker1").env["OMP_NUM_THREADS"] == "2" and run.node("ps0").env["TFLAB_NUM_CPUS"] == "1"
    assert chosen.describe() == "cpus ps0=0.5,worker0=0.5,worker1=2"
    assert knobs.Knobs(cpus={"ps0": 0.5, "worker0": 0.5}).describe() == "cpus 0.5"
    with pytest.raises(UserError, match="cannot have more than 4 CPU"):
        knobs.parse(lab, 4, cpus=["worker0=5"])


def test_knobs_in_words_and_in_run_json() -> None:
    lab = plan(Topology(nodes=4), [])
    chosen = knobs.parse(lab, 2, workers="1", link_rate="NONE", env=["BATCH=32"])
    assert chosen.link_rate == knobs.UNSHAPED and chosen.changes_engine
    assert chosen.describe() == "workers 1, link unshaped, BATCH=32"
    assert knobs.describe(json.loads(json.dumps(chosen.as_dict()))) == chosen.describe()
    assert not knobs.Knobs() and knobs.describe(None) == ""
    assert knobs.parse(lab, 2, link_rate="1GBit").describe() == "link 1gbit"
