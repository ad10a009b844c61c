"""Run-time knobs on real containers: the cluster a task sees under --workers, and links and CPU
set for one run and restored after it, however it ended (verdict, Ctrl-C, tflab killed)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import cli
from test_docker_run import add_tasks, exec_quiet, lab_containers

from tflab.host import labfiles
from tflab.run import runreport

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TFLAB = [sys.executable, "-m", "tflab"]

# What a node's link and CPU are, from inside it: tc's rate on eth0 (or `unshaped`), the CFS quota (v1 or v2).
PROBE = ("echo \"cluster=$TF_CONFIG\"; echo \"hosts={worker_hosts} batch={BATCH} env=$BATCH\"; "
         "r=$(tc qdisc show dev eth0 | grep -o 'rate [0-9A-Za-z]*' | head -1); echo \"link=${r:-unshaped}\"; "
         "if [ -f /sys/fs/cgroup/cpu.max ]; then q=$(cut -d' ' -f1 /sys/fs/cgroup/cpu.max); "
         "else q=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us); fi; echo \"quota=$q\"")
SERVE = "if [ {job_name} = ps ]; then exec python -m http.server 2222; fi; "


def node_now(lab: Path, node: str) -> dict[str, str]:
    """A node's link rate and CPU quota now, as the probe prints them (through the engine, not tflab: a tflab
    command would restore what a killed one left)."""
    import docker

    client = docker.from_env()
    container = lab_containers(client, labfiles.open_lab(lab).project)[node]
    code, out = exec_quiet(client, container, ["sh", "-c", PROBE.replace("{worker_hosts}", "-")
                                               .replace("{BATCH}", "-")])
    assert code == 0, out
    return dict(line.split("=", 1) for line in out.splitlines() if line.startswith(("link=", "quota=")))


def probe_lines(output: str, node: str) -> dict[str, str]:
    prefix = f"[{node}] "
    return dict(line[len(prefix):].split("=", 1) for line in output.splitlines()
                if line.startswith(prefix) and "=" in line)


@pytest.fixture(scope="module")
def knob_lab(module_labs) -> Path:
    """A running lab of ps0 and three workers with NET_ADMIN (--faults), unshaped and with no CPU quota, shared by
    the module's tests: each ends asserting that every node is back as the lab says."""
    lab = module_labs.gen("--faults", "--cpus-per-node", "0", nodes=4)
    add_tasks(lab, {"probe": SERVE + PROBE, "wait": SERVE + PROBE + "; sleep 300"})
    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    return lab


def test_knobs_shape_one_run_and_the_lab_gets_its_own_design_back(knob_lab: Path, runner) -> None:
    lab = knob_lab
    before = node_now(lab, "worker0")
    assert before == {"link": "unshaped", "quota": before["quota"]} and before["quota"] in ("-1", "max")

    result = runner.invoke(cli, ["run", "probe", "--workers", "2", "--link-rate", "20mbit", "--cpus", "0.5",
                                 "--cpus", "worker1=0.25", "--env", "BATCH=64", "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout + result.stderr
    out = result.stdout
    # --workers 2: the run's cluster is ps0, worker0 and worker1, in TF_CONFIG and the placeholders alike
    seen = probe_lines(out, "worker1")
    assert json.loads(seen["cluster"]) == {"cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222"]},
                                           "task": {"type": "worker", "index": 1}}
    assert seen["hosts"] == "worker0:2222,worker1:2222 batch=64 env=64"
    assert "[worker2]" not in out, "the third worker stays idle"
    # the run's links and CPU, from inside the nodes while it ran
    assert seen["link"] == "rate 20Mbit" and seen["quota"] == "25000"
    assert probe_lines(out, "worker0")["link"] == "rate 20Mbit" and probe_lines(out, "worker0")["quota"] == "50000"
    assert "this run's knobs: workers 2, link 20mbit, cpus ps0=0.5,worker0=0.5,worker1=0.25,worker2=0.5, BATCH=64" \
        in out.replace("\n", " ")
    assert "knobs: workers 2" in out
    # restored after the run
    assert node_now(lab, "worker1") == before
    report = runreport.load(lab / "runs" / "probe")
    assert report is not None and report.knobs == {"workers": 2, "link_rate": "20mbit",
                             "cpus": {"ps0": 0.5, "worker0": 0.5, "worker1": 0.25, "worker2": 0.5},
                             "env": {"BATCH": "64"}}
    assert set(report.nodes) == {"ps0", "worker0", "worker1"}
    listed = runner.invoke(cli, ["runs", "--lab", str(lab)])
    assert "workers" in listed.stdout and "20mbit" in listed.stdout, listed.stdout


def shaped_run(lab: Path) -> subprocess.Popen:
    """`tflab run wait` with knobs, returned once its workers printed what they see."""
    child = subprocess.Popen([*TFLAB, "run", "wait", "--link-rate", "10mbit", "--cpus", "worker0=0.3",
                              "--lab", str(lab)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        lines.append(line)
        if line.startswith("[worker0] quota="):
            return child
        assert line, "".join(lines)
    raise AssertionError("".join(lines))


def test_an_interrupted_run_and_a_killed_tflab_leave_the_lab_as_it_was(knob_lab: Path, runner) -> None:
    lab = knob_lab
    before = node_now(lab, "worker0")

    child = shaped_run(lab)
    assert node_now(lab, "worker0") == {"link": "rate 10Mbit", "quota": "30000"}
    child.send_signal(signal.SIGINT)
    rest, _ = child.communicate(timeout=90)
    assert child.returncode != 0 and "restored: " in rest, rest
    assert node_now(lab, "worker0") == before and node_now(lab, "ps0") == before

    child = shaped_run(lab)
    child.kill()
    child.wait(timeout=30)
    assert node_now(lab, "worker0")["link"] == "rate 10Mbit", "nothing restores it until tflab is asked again"
    status = runner.invoke(cli, ["status", "--lab", str(lab)])
    assert status.exit_code == 0, status.stderr
    assert "run wait (pid " in status.stderr and "ended without restoring what its knobs changed" in status.stderr
    assert node_now(lab, "worker0") == before and node_now(lab, "worker2") == before


# What TensorFlow decided as it was imported: TF_ENABLE_ONEDNN_OPTS is read once, then (IsMklEnabled caches it).
ONEDNN = '''import argparse, os, socket, time
import tensorflow as tf
from tensorflow.python.util import _pywrap_util_port
parser = argparse.ArgumentParser()
parser.add_argument("--job_name")
args = parser.parse_args()
if args.job_name == "ps":
    server = socket.socket()
    server.bind(("0.0.0.0", 2222))
    server.listen()
    time.sleep(300)
print("onednn=%s env=%s threads=%s" % (_pywrap_util_port.IsMklEnabled(), os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                                        os.environ.get("TF_NUM_INTRAOP_THREADS")), flush=True)
'''


def test_env_and_cpus_reach_the_program_as_a_cold_start_would(labs, runner) -> None:
    """TensorFlow reads TF_ENABLE_ONEDNN_OPTS as it is imported: a run's --env reaches the program's own import.

    TensorFlow's default depends on the CPU (on with AVX-512, off without): the plain run tells it, and the
    run with --env asks for the other."""
    lab = labs.gen(nodes=2)
    (lab / "code" / "onednn.py").write_text(ONEDNN)
    add_tasks(lab, {"onednn": "python /workspace/onednn.py --job_name={job_name}"})
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    plain = runner.invoke(cli, ["run", "onednn", "--lab", str(lab)])
    assert plain.exit_code == 0, plain.stdout[-2000:]
    found = re.search(r"\[worker0\] onednn=(True|False) env=None", plain.stdout)
    assert found, plain.stdout[-2000:]
    default = found.group(1) == "True"
    flipped = "0" if default else "1"
    off = runner.invoke(cli, ["run", "onednn", "--env", f"TF_ENABLE_ONEDNN_OPTS={flipped}", "--lab", str(lab)])
    assert off.exit_code == 0, off.stdout[-2000:]
    assert f"[worker0] onednn={not default} env={flipped}" in off.stdout, off.stdout[-2000:]
    cpus = runner.invoke(cli, ["run", "onednn", "--cpus", "0.5", "--lab", str(lab)])
    assert cpus.exit_code == 0, cpus.stdout[-2000:]
    assert f"[worker0] onednn={default} env=None threads=1" in cpus.stdout, cpus.stdout[-2000:]
