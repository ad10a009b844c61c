"""Fidelity on real containers: a link is a NIC both ways, and each run names what limited it (issue 26).

Each limit is shown true by a run made to have it: a starved parameter server, a shaped link
that three workers push into at once, four busy nodes without CPU shares of their own on a host
with fewer CPUs, one starved worker of an all-reduce run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, cli
from test_docker_run import add_tasks

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.alone]
PROGRAMS = REPO / "tests" / "programs"
SHORT = ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
         "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=300")


def limit_of(lab: Path, task: str) -> dict:
    return json.loads((lab / "runs" / task / "run.json").read_text())["limit"]


def up(runner, lab: Path) -> None:
    result = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout[-2000:] + result.stderr[-2000:]


def run(runner, lab: Path, task: str) -> str:
    result = runner.invoke(cli, ["run", task, "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = result.stdout + result.stderr
    assert "what limited this run: host" not in text or limit_of(lab, task)["kind"] == "host"
    return text


def test_a_link_holds_its_rate_both_ways_and_is_named_the_limit(labs, runner) -> None:
    lab = labs.gen("--link-rate", "20mbit", nodes=4, code=PROGRAMS)
    add_tasks(lab, {"into": "python /workspace/blast.py in {job_name} {node} 8 3",
                    "from": "python /workspace/blast.py out {job_name} {node} 8 3"})
    up(runner, lab)
    shaped = runner.invoke(cli, ["exec", "--lab", str(lab), "ps0", "--", "tc", "qdisc", "show"])
    assert "ingress ffff:" in shaped.stdout and re.search(r"qdisc tbf 10: dev tfi0 root .*rate 20Mbit", shaped.stdout), \
        shaped.stdout

    into = run(runner, lab, "into")
    received = float(re.search(r"ps0: received ([\d.]+) Mbit/s from 3 workers at once", into).group(1))
    assert 16 <= received <= 24, f"three workers into one 20mbit node: {received} Mbit/s"  # 60 unshaped
    limit = limit_of(lab, "into")
    assert limit["kind"] == "link" and limit["evidence"].startswith("ps0 received "), limit
    assert "what limited this run: link: ps0 received" in into

    out = run(runner, lab, "from")
    rates = [float(x) for x in re.findall(r"worker\d: received ([\d.]+) Mbit/s from ps0", out)]
    assert len(rates) == 3 and 16 <= sum(rates) <= 24, f"one 20mbit node into three: {rates}"
    assert limit_of(lab, "from")["kind"] == "link"


def test_a_starved_parameter_server_is_the_limit_and_the_host_is_not_blamed(labs, runner) -> None:
    lab = labs.gen(nodes=4)
    add_tasks(lab, {"short": SHORT})
    up(runner, lab)
    normal = run(runner, lab, "short")
    assert "what limited this run: host" not in normal, "the shares fit the host: no blame for it"
    starved = runner.invoke(cli, ["fault", "cpu", "ps0", "0.1", "--lab", str(lab)])
    assert starved.exit_code == 0, starved.stderr
    text = run(runner, lab, "short")
    limit = limit_of(lab, "short")
    assert limit["kind"] == "ps-cpu" and limit["evidence"].startswith("ps0 at "), limit
    share = int(re.match(r"ps0 at (\d+)% of its 0.1 CPU", limit["evidence"]).group(1))
    assert share >= 85 or "held back at its quota" in limit["evidence"], limit
    assert "what limited this run: ps-cpu: ps0 at" in text
    runs = runner.invoke(cli, ["runs", "--lab", str(lab)])
    assert "ps-cpu" in runs.stdout


def test_busy_nodes_without_shares_on_a_smaller_host_blame_the_host(labs, runner) -> None:
    lab = labs.gen("--cpus-per-node", "0", nodes=4, code=PROGRAMS)
    # the host smaller than the four nodes' work, whatever its CPUs: each node burns one more than its quarter,
    # for 20 s: start-up (a late release) is a small part of the training
    each = len(labfiles.open_lab(lab).config.host.cpus) // 4 + 1
    add_tasks(lab, {"burn": f"python /workspace/burn.py {{job_name}} 20 {each}"})
    up(runner, lab)
    text = run(runner, lab, "burn")
    limit = limit_of(lab, "burn")
    assert limit["kind"] == "host", (limit, json.loads((lab / "runs" / "burn" / "run.json").read_text())["cluster"])
    assert "ps0, worker0, worker1, worker2 have no CPU share of their own" in limit["evidence"], limit
    assert "what limited this run: host: " in text


def test_one_starved_worker_of_an_allreduce_run_is_named_the_straggler(labs, runner) -> None:
    lab = labs.gen("--ps", "0", nodes=3)
    # The example, shorter and without its backups: a straggler shows in 125 steps (at 0.1 CPU, 300 took 3 min).
    add_tasks(lab, {"allreduce_short": "python /workspace/allreduce.py --steps 125 --backup_every 0"})
    up(runner, lab)
    starved = runner.invoke(cli, ["fault", "cpu", "worker2", "0.1", "--lab", str(lab)])
    assert starved.exit_code == 0, starved.stderr
    text = run(runner, lab, "allreduce_short")
    limit = limit_of(lab, "allreduce_short")
    assert limit["kind"] == "worker-cpu", (limit, text[-3000:])
    assert limit["evidence"].startswith("worker2 at ") and limit["evidence"].endswith("worker2 is the straggler"), limit
