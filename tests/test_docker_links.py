"""Links like a cluster's on the real engine: a shaped rate, and a delay where the kernel has netem."""

from __future__ import annotations

import json
import re
import subprocess
import time
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli

from tflab.engine.containers import probe_qdiscs
from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.alone]
PROGRAMS = REPO / "tests" / "programs"
TFLAB = [sys.executable, "-m", "tflab"]


def throughput(lab: Path, megabytes: int = 50, during=None) -> float:
    """Mbit/s of `megabytes` sent from ps0 to worker0 over the lab network, as worker0 measures them.

    `during` is called a second into the transfer.
    """
    receiver = subprocess.Popen([*TFLAB, "exec", "--lab", str(lab), "worker0", "--", "python",
                                 "/workspace/throughput.py", "serve", "5001"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    assert receiver.stdout.readline() == "listening\n"
    sender = subprocess.Popen([*TFLAB, "exec", "--lab", str(lab), "ps0", "--", "python", "/workspace/throughput.py",
                               "send", "worker0", "5001", str(megabytes)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    if during is not None:
        time.sleep(1)
        during()
    _, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    out, _ = receiver.communicate(timeout=60)
    match = re.search(rf"received {megabytes << 20} bytes in [\d.]+ s: ([\d.]+) Mbit/s", out)
    assert match, out
    return float(match.group(1))


def test_a_shaped_link_runs_at_its_rate_and_an_unshaped_one_far_faster(labs, runner) -> None:
    shaped = labs.gen("--link-rate", "100mbit", nodes=2, code=PROGRAMS)
    plain = labs.gen(nodes=2, code=PROGRAMS)
    for lab in (shaped, plain):
        up = runner.invoke(cli, ["up", "--lab", str(lab)])
        assert up.exit_code == 0, up.stderr
    status = runner.invoke(cli, ["status", "--lab", str(shaped)])
    # the caption wraps to the table's width, its lines padded: words, not lines, are compared
    assert "links: 100mbit (each node's link, both ways)" in " ".join(status.stdout.split()), status.stdout
    tc = runner.invoke(cli, ["exec", "--lab", str(shaped), "worker0", "--", "tc", "qdisc", "show", "dev", "eth0"])
    assert "tbf" in tc.stdout and "rate 100Mbit" in tc.stdout, tc.stdout
    seen: dict = {}

    def top() -> None:
        done = subprocess.run([*TFLAB, "top", "--once", "--json", "--lab", str(shaped)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen.update({row["node"]: row for row in json.loads(done.stdout)["nodes"]})

    rate = throughput(shaped, during=top)
    fast = throughput(plain)
    print(f"shaped 100mbit: {rate:.1f} Mbit/s; unshaped: {fast:.1f} Mbit/s; top: {seen['ps0']['net']}")
    assert 70 <= rate <= 115
    assert fast >= 5 * rate
    assert 70 <= seen["ps0"]["net"]["tx_mbit"] <= 115, "top reads the sender's link at its rate"
    assert seen["worker0"]["net"]["rx_mbit"] >= 50


def test_a_delay_is_applied_or_refused_at_up_with_the_reason(labs, runner, docker_client, base_image) -> None:
    offered = probe_qdiscs(docker_client, base_image)
    lab = labs.gen("--link-delay", "5", nodes=2, code=PROGRAMS)
    project = labfiles.open_lab(lab).project
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    if offered.get("netem") is None:
        # This kernel has netem: the delay is there, on the lab network.
        assert up.exit_code == 0, up.stderr
        tc = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "--", "tc", "qdisc", "show", "dev", "eth0"])
        assert "netem" in tc.stdout and "delay 5ms" in tc.stdout
        return
    assert up.exit_code == 2, up.stdout + up.stderr
    assert len(up.stderr.strip().splitlines()) >= 1
    last = up.stderr.strip().splitlines()[-1]
    assert last.startswith("tflab: error: this host's kernel has no netem qdisc (")
    assert "which --link-delay needs; load it (modprobe sch_netem) or generate the lab without --link-delay" in last
    assert docker_client.containers.list(all=True, filters={"label": f"tflab.lab={project}"}) == []
