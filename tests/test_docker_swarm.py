"""A lab on a real (one-node) Docker Swarm: up, status, run (docker exec and SSH), down."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import REPO, cli
from test_docker_run import lines_of

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.swarm]


@pytest.fixture(scope="module")
def swarm(docker_client):
    """This engine as a one-node swarm; left again afterwards if this test made it one."""
    state = (docker_client.info().get("Swarm") or {}).get("LocalNodeState")
    made = state != "active"
    gwbridge = not docker_client.networks.list(names=["docker_gwbridge"])  # the engine makes it at init
    if made:
        subprocess.run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"], check=True, capture_output=True)
    yield docker_client
    if made:
        subprocess.run(["docker", "swarm", "leave", "--force"], check=True, capture_output=True)
        if gwbridge:
            subprocess.run(["docker", "network", "rm", "docker_gwbridge"], capture_output=True)


def complete_checkpoint(run_dir: Path) -> bool:
    final = Path((run_dir / "checkpoint").read_text().splitlines()[0].split('"')[1]).name
    return all((run_dir / f"{final}{suffix}").is_file() for suffix in (".index", ".meta", ".data-00000-of-00001"))


def test_a_compose_only_engine_is_told_how_to_make_a_swarm(labs, runner, docker_client) -> None:
    assert (docker_client.info().get("Swarm") or {}).get("LocalNodeState") != "active", \
        "this engine is a swarm already: a test that made it one did not leave it"
    lab = labs.gen("--target", "swarm", "--bind", "0.0.0.0", nodes=2)
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 2
    assert up.stderr.strip().splitlines()[-1] == (
        "tflab: error: this engine is not part of a swarm: `docker swarm init` makes this host a one-node swarm, "
        "or join it to yours (README: Beyond one host)")


def test_a_swarm_lab_trains_and_goes_away(swarm, labs, runner) -> None:
    """The README's one-host swarm: gen, up (no registry: the image is this engine's own),
    run train, status, down. Its run goes over docker exec, the README's; the two-host walk trains a swarm lab
    over docker exec and over SSH, through the ports published on both hosts (this one's too), so the SSH run
    is not made twice."""
    lab = labs.gen("--target", "swarm", "--bind", "0.0.0.0", nodes=4)
    lf = labfiles.open_lab(lab)
    label = {"label": f"tflab.lab={lf.project}"}
    try:
        up = runner.invoke(cli, ["up", "--lab", str(lab)])
        assert up.exit_code == 0, up.stdout + up.stderr
        assert (lab / "docker-stack.yml").is_file()
        status = runner.invoke(cli, ["status", "--lab", str(lab)])
        rows = {line.split("│")[1].strip(): line for line in status.stdout.splitlines() if line.startswith("│ ")}
        assert set(rows) == {"ps0", "worker0", "worker1", "worker2"}, status.stdout
        assert all("running" in row for row in rows.values()), status.stdout
        assert "ports are published on the swarm node each runs on" in status.stdout

        trained = runner.invoke(cli, ["run", "train", "--lab", str(lab)])  # --via docker, the default
        assert trained.exit_code == 0, (trained.stdout[-3000:], trained.stderr[-2000:])
        accuracy = [line for line in lines_of(trained.stdout, "worker0") if "test accuracy" in line]
        assert accuracy and float(accuracy[-1].split()[-1]) >= 0.9, accuracy
        assert complete_checkpoint(lf.runs_dir / "train")

        hello = runner.invoke(cli, ["exec", "--lab", str(lab), "worker2", "--", "getent", "hosts", "ps0"])
        assert hello.exit_code == 0 and hello.stdout.split()[1:] == ["ps0"], hello.stdout
        down = runner.invoke(cli, ["down", "--lab", str(lab)])
        assert down.exit_code == 0, down.stderr
        assert swarm.services.list(filters=label) == []
        assert swarm.containers.list(all=True, filters=label) == []
        assert swarm.networks.list(filters=label) == []
    finally:
        subprocess.run(["docker", "stack", "rm", lf.project], capture_output=True)


def test_three_workers_into_one_node_share_its_link_on_a_swarm_too(swarm, labs, runner) -> None:
    """Issue 26.1 on a swarm lab: a node's shaped link holds its rate both ways."""
    import re

    from test_docker_run import add_tasks

    lab = labs.gen("--target", "swarm", "--bind", "0.0.0.0", "--link-rate", "20mbit", nodes=4,
                   code=REPO / "tests" / "programs")
    add_tasks(lab, {"into": "python /workspace/blast.py in {job_name} {node} 8 3",
                    "from": "python /workspace/blast.py out {job_name} {node} 8 3"})
    lf = labfiles.open_lab(lab)
    try:
        up = runner.invoke(cli, ["up", "--lab", str(lab)])
        assert up.exit_code == 0, up.stdout[-2000:] + up.stderr[-2000:]
        into = runner.invoke(cli, ["run", "into", "--lab", str(lab)])
        assert into.exit_code == 0, into.stdout[-3000:] + into.stderr[-2000:]
        received = float(re.search(r"ps0: received ([\d.]+) Mbit/s from 3 workers at once", into.stdout).group(1))
        assert 16 <= received <= 24, f"three workers into one 20mbit swarm node: {received} Mbit/s"
        out = runner.invoke(cli, ["run", "from", "--lab", str(lab)])
        assert out.exit_code == 0, out.stdout[-3000:] + out.stderr[-2000:]
        rates = [float(x) for x in re.findall(r"worker\d: received ([\d.]+) Mbit/s from ps0", out.stdout)]
        assert len(rates) == 3 and 16 <= sum(rates) <= 24, f"one 20mbit swarm node into three: {rates}"
        assert runner.invoke(cli, ["down", "--lab", str(lab)]).exit_code == 0
    finally:
        subprocess.run(["docker", "stack", "rm", lf.project], capture_output=True)
