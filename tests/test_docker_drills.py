"""Faults on purpose on the real engine: drills at a training step, and `tflab fault` by hand, healed without a trace."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import cli
from test_docker_run import add_tasks

from tflab.cli.fault import injector
from tflab.engine.containers import lab_containers
from tflab.engine.executors import exec_quiet
from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TFLAB = [sys.executable, "-m", "tflab"]


def run(lab: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*TFLAB, "run", *args, "--lab", str(lab)], capture_output=True, text=True, timeout=timeout)


def record(lab: Path, task: str) -> dict:
    return json.loads((lab / "runs" / task / "run.json").read_text())


def nothing_left(lab: Path, client) -> None:
    """No rule, qdisc, pause, quota or downed node of tflab's in any node, read from the nodes themselves."""
    lf = labfiles.open_lab(lab)
    assert injector(lf).state() == {}
    for name, container in lab_containers(client, lf.project).items():
        assert container.status == "running", name
        _, rules = exec_quiet(client, container, ["sh", "-c", "iptables -S 2>/dev/null; tc qdisc show"])
        assert "TFLAB" not in rules and " tbf " not in rules and "netem" not in rules, (name, rules)
        quota = container.attrs["HostConfig"].get("CpuQuota") or 0
        planned = lf.lab.node(name).share.quota
        assert quota == (int(planned * 100_000) if planned else 0), (name, quota)


@pytest.fixture(scope="module")
def drill_lab(module_labs) -> Path:
    """A 4-node lab (ps0, three workers) whose nodes may be slowed and cut off, shared by the module's tests:
    each ends asserting that nothing of a fault is left in it (nothing_left)."""
    lab = module_labs.gen("--faults", nodes=4)
    assert CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    return lab


def test_a_parameter_server_job_survives_a_lost_worker_and_a_rebooted_one(labs, runner, docker_client) -> None:
    lab = labs.gen("--chief", nodes=3)
    # The coordinator takes the worker back only if it trains on once the worker is back: its 2000 steps took
    # 16 s in a fresh clone's loaded start, and the killed worker's machine was back 7 s after the kill, its
    # server later still: the chief ended first, recovery never logged. Twice the steps leave it the time.
    add_tasks(lab, {"ps_long": {"command": "python /workspace/ps_strategy.py --steps 4000", "servers": ["ps", "worker"]}})
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    done = run(lab, "ps_long", "--fault", "kill worker1 at step 50 then restart", "--expect", "survive")
    assert done.returncode == 0, done.stdout[-4000:]
    assert "tflab: drill: killed worker1" in done.stdout
    assert "INFO:tensorflow:Worker /job:worker/replica:0/task:1 has been recovered." in done.stdout
    assert "chief: test accuracy" in done.stdout
    drill = record(lab, "ps_long")["faults"][0]
    assert drill["hit_step"] >= 50 and drill["back_s"] > drill["hit_s"]
    assert re.search(r"│ kill\s+│ step 50 │", done.stdout) and "back at" in done.stdout
    assert record(lab, "ps_long")["nodes"]["worker1"]["attempt"] == 2
    nothing_left(lab, docker_client)
    rebooted = run(lab, "ps_strategy", "--fault", "restart worker1 at step 50", "--expect", "survive")
    assert rebooted.returncode == 0, rebooted.stdout[-4000:]
    assert "tflab: drill: restarted worker1 (a reboot" in rebooted.stdout
    assert "tflab: worker1 starts again (attempt 2)" in rebooted.stdout
    assert record(lab, "ps_strategy")["nodes"]["worker1"]["attempt"] == 2
    nothing_left(lab, docker_client)


def test_an_allreduce_job_resumes_from_its_backup_after_a_restart(labs, runner, docker_client) -> None:
    lab = labs.gen("--ps", "0", nodes=4)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    done = run(lab, "allreduce", "--fault", "kill worker1 at step 50", "--restarts", "1")
    assert done.returncode == 0, done.stdout[-4000:]
    lines = done.stdout.splitlines()
    restart = next(i for i, line in enumerate(lines) if "restarting every worker together" in line)
    resumed = next(line for line in lines[restart:] if "[worker0] worker0: resuming from the backup at step" in line)
    saved = int(resumed.rsplit(" ", 1)[1])
    first = next(line for line in lines[restart:] if re.match(r"\[worker0\] worker0: step \d+ ", line))
    assert saved >= 25 and int(first.split()[3]) >= saved, (resumed, first)
    losses = {line.split()[4] for line in lines if "final loss" in line}
    assert len(losses) == 1, "every worker holds the same model"
    nothing_left(lab, docker_client)


@pytest.mark.waits  # mostly waits (on the 15 s pause)
def test_a_paused_worker_does_not_stop_the_others(drill_lab: Path, docker_client) -> None:
    done = run(drill_lab, "train", "--fault", "pause worker2 at step 100 for 15s")
    assert done.returncode == 0, done.stdout[-4000:]
    drill = record(drill_lab, "train")["faults"][0]
    assert drill["healed_s"] - drill["hit_s"] >= 15
    for worker in ("worker0", "worker1"):
        before, after = drill["during"][worker]  # before None: still starting when the run reached step 100
        assert after is not None and (before is None or after > before), (worker, drill["during"])
    nothing_left(drill_lab, docker_client)


@pytest.mark.waits  # mostly waits (on the cut and TensorFlow's reconnects)
def test_a_cut_parameter_server_recovers_or_fails_naming_the_cut_never_hangs(drill_lab: Path, docker_client) -> None:
    done = run(drill_lab, "train", "--fault", "cut ps0 at step 100 for 10s")
    data = record(drill_lab, "train")
    drill = data["faults"][0]
    assert drill["healed_s"] is not None
    assert data["duration_s"] - drill["healed_s"] <= 60 + 15, "it ended within a minute of the cut's end"
    if done.returncode != 0:
        assert "cut ps0" in (data["problem"] or ""), data["problem"]
    nothing_left(drill_lab, docker_client)


@pytest.mark.waits  # mostly waits (with the other tests of drill_lab, which stays one lab)
def test_faults_by_hand_and_clear_leaves_nothing(drill_lab: Path, runner, docker_client) -> None:
    lf = labfiles.open_lab(drill_lab)
    for args in (["slow", "ps0", "10mbit"], ["cpu", "worker1", "0.2"], ["cut", "worker2", "--from", "ps0"],
                 ["pause", "worker0"], ["kill", "worker1"]):
        result = runner.invoke(cli, ["fault", *args, "--lab", str(drill_lab)])
        assert result.exit_code == 0, result.stderr
    left = injector(lf).state()
    assert left == {"ps0": ["qdisc eth0 rate 10Mbit"], "worker0": ["paused"], "worker1": ["downed by a fault"],
                    "worker2": ["cut 2"]}, left
    pinged = subprocess.run([*TFLAB, "exec", "--lab", str(drill_lab), "worker2", "--", "timeout", "3", "bash", "-c",
                             "exec 3<>/dev/tcp/ps0/22"], capture_output=True, timeout=60)
    assert pinged.returncode != 0, "worker2 cannot reach ps0"
    cleared = runner.invoke(cli, ["fault", "clear", "--lab", str(drill_lab)])
    assert cleared.exit_code == 0 and "tflab: every node is as the lab says" in cleared.stdout
    nothing_left(drill_lab, docker_client)
    timed = runner.invoke(cli, ["fault", "pause", "worker2", "--for", "1", "--lab", str(drill_lab)])
    assert timed.exit_code == 0 and "tflab: unpaused worker2 after 1s" in timed.stdout
    nothing_left(drill_lab, docker_client)


def test_network_faults_need_a_lab_made_for_them(labs, runner) -> None:
    lab = labs.gen(nodes=2)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    result = runner.invoke(cli, ["fault", "cut", "worker0", "--lab", str(lab)])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("tflab: error: cut changes a node's network, which needs the NET_ADMIN capability: "
                                     "give the lab that: `tflab set --faults` (or --link-rate RATE), then `tflab up`")
    drill = runner.invoke(cli, ["run", "train", "--fault", "slow ps0 1mbit at 5s", "--lab", str(lab)])
    assert drill.exit_code == 2 and "needs the NET_ADMIN capability" in drill.stderr
    assert not (lab / "runs" / "train").exists(), "refused before anything ran"
