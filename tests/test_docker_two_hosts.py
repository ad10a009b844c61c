"""Two hosts on one machine: the README's two-host walk-through, run command by command.

scripts/two_hosts.py makes host b (a second engine in a container of this one), the swarm and a
registry; the walk pushes the node image, places two nodes on each host, trains across them
over docker exec and over SSH, reaches host b's nodes, names each node's host, and leaves
nothing behind on either engine. The commands are read from the README's block, so what a team
follows is what this test runs (with its own folder, registry port, lab name and ports).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import LONG, REPO, free_port_base
from test_docker_run import lines_of
from test_docker_swarm import complete_checkpoint

from tflab.render import templates

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.swarm, pytest.mark.waits]

FIXTURE = REPO / "scripts" / "two_hosts.py"
TFLAB = Path(sys.executable).parent / "tflab"
HOST_B = "tflab-host-b"


def readme_walk() -> list[str]:
    """The commands of the README's two-host block, comments taken off."""
    text = (REPO / "README.md").read_text()
    block = next(b for b in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE) if "scripts/two_hosts.py up" in b)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


class Walk:
    """Runs README commands with this test's folder, registry port, state file, lab name and ports."""

    def __init__(self, share: Path, port: int) -> None:
        self.share, self.port = share, port
        self.state = share.parent / "two-hosts-state.json"
        self.name = f"t{uuid.uuid4().hex[:10]}"
        self.env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}

    def argv(self, line: str, name: str | None = None) -> list[str]:
        line = line.replace("/tmp/labs", str(self.share)).replace("127.0.0.1:5000", f"127.0.0.1:{self.port}")
        argv = shlex.split(line)
        if argv[:2] == ["python", "scripts/two_hosts.py"]:
            argv = [sys.executable, str(FIXTURE), *argv[2:]]
            if argv[2] in ("up", "down"):
                argv += ["--state", str(self.state)] + (["--port", str(self.port)] if argv[2] == "up" else [])
        elif argv[0] == "tflab":
            argv = [str(TFLAB), *argv[1:]]
            if argv[1] == "gen":
                base = free_port_base(12)  # one free range for both (two drawn apart may overlap)
                argv += ["--name", name or self.name, "--ssh-port-base", str(base),
                         "--tensorboard-port-base", str(base + 6)]
        return argv

    def run(self, line: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(line), capture_output=True, text=True, timeout=timeout, env=self.env)

    def in_b(self, *argv: str) -> str:
        return subprocess.run(["docker", "exec", HOST_B, "docker", *argv], capture_output=True, text=True,
                              check=True, timeout=120).stdout


def engines_hold_nothing(walk: Walk, client, project: str) -> None:
    """No service, container or network of the lab on this engine or on host b's."""
    label = {"label": f"tflab.lab={project}"}
    assert client.services.list(filters=label) == []
    assert client.containers.list(all=True, filters=label) == []
    assert client.networks.list(filters=label) == []
    assert [t for t in client.api.tasks()
            if t["Spec"]["ContainerSpec"].get("Labels", {}).get("com.docker.stack.namespace") == project] == []
    # Its tasks are gone from the swarm: host b's agent removes the containers it shut down a moment later.
    on_b = []
    for _ in range(20):
        on_b = walk.in_b("ps", "-aq", "--filter", f"label=com.docker.stack.namespace={project}").split()
        if not on_b:
            break
        time.sleep(0.5)
    assert on_b == []
    assert project not in walk.in_b("network", "ls", "--format", "{{.Name}}")


def test_the_readme_two_host_walk_spans_two_engines_and_leaves_nothing(tmp_path, docker_client, base_image) -> None:
    walk_lines = readme_walk()
    assert [line.split()[:3] for line in walk_lines] == [
        ["python", "scripts/two_hosts.py", "up"], ["tflab", "gen", "--target"], ["tflab", "up", "--lab"],
        ["python", "scripts/two_hosts.py", "docker"], ["tflab", "run", "train"], ["tflab", "run", "train"],
        ["tflab", "exec", "worker2"], ["tflab", "status", "--lab"], ["tflab", "down", "--lab"],
        ["python", "scripts/two_hosts.py", "down"]], walk_lines
    fixture_up, gen, up, images, train, train_ssh, hostname, status, down, fixture_down = walk_lines
    walk = Walk(tmp_path / "labs", free_port_base(1))
    had_gwbridge = bool(docker_client.networks.list(names=["docker_gwbridge"]))
    lab = walk.share / "two-hosts"
    project = templates.project_name(walk.name, lab)
    try:
        made = walk.run(fixture_up, timeout=900)
        assert made.returncode == 0, made.stdout + made.stderr
        assert json.loads(walk.state.read_text())["registry"] == f"127.0.0.1:{walk.port}"
        swarm_hosts = {n.attrs["Spec"]["Labels"].get("tflab.host"): n.attrs["Description"]["Hostname"]
                       for n in docker_client.nodes.list()}
        assert set(swarm_hosts) == {"a", "b"} and swarm_hosts["b"] == "host-b", swarm_hosts

        generated = walk.run(gen)
        assert generated.returncode == 0, generated.stderr
        assert yaml.safe_load((lab / "tflab.yaml").read_text())["swarm"]["place"] == {
            "ps0": "a", "worker0": "a", "worker1": "b", "worker2": "b"}
        refused_before_anything_is_made(walk, docker_client, gen)

        deployed = walk.run(up, timeout=900)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        assert f"pushing 127.0.0.1:{walk.port}/tflab-node" in deployed.stdout + deployed.stderr
        held = walk.run(images)
        assert held.returncode == 0 and f"127.0.0.1:{walk.port}/tflab-node" in held.stdout, held.stdout
        assert walk.in_b("ps", "-q", "--filter", f"label=com.docker.stack.namespace={project}").split(), \
            "host b runs none of the lab's containers"

        for line in (train, train_ssh):
            trained = walk.run(line)
            assert trained.returncode == 0, (line, trained.stdout[-3000:], trained.stderr[-2000:])
            accuracy = [x for x in lines_of(trained.stdout, "worker0") if "test accuracy" in x]
            assert accuracy and float(accuracy[-1].split()[-1]) >= 0.9, (line, accuracy)
            assert complete_checkpoint(lab / "runs" / "train"), line

        answered = walk.run(hostname)
        assert answered.returncode == 0 and answered.stdout.strip() == "worker2", answered.stdout + answered.stderr
        mounts = walk.run(hostname.replace("-- hostname", "-- cat /proc/self/mountinfo"))
        container = re.search(r"/containers/([0-9a-f]{64})/hostname", mounts.stdout)
        assert container, mounts.stdout
        assert container.group(1) in walk.in_b("ps", "-q", "--no-trunc").split(), "worker2 is not host b's container"
        assert container.group(1) not in [c.id for c in docker_client.containers.list()]

        shown = walk.run(status)
        assert shown.returncode == 0, shown.stderr
        rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")]
                for line in shown.stdout.splitlines() if line.startswith("│ ")}
        here = docker_client.info()["Name"]
        assert set(rows) == {"ps0", "worker0", "worker1", "worker2"}, shown.stdout
        for node, cells in rows.items():
            assert (here if node in ("ps0", "worker0") else "host-b") in cells, (node, shown.stdout)

        a_lost_worker_ends_the_run_naming_it(walk, lab, project)

        gone = walk.run(down)
        assert gone.returncode == 0, gone.stderr
        engines_hold_nothing(walk, docker_client, project)
    finally:
        subprocess.run(["docker", "stack", "rm", project], capture_output=True)
        left = walk.run(fixture_down, timeout=300)
        tags = [t for image in docker_client.images.list() for t in image.tags]
        for tag in (t for t in tags if t.startswith(f"127.0.0.1:{walk.port}/")):
            docker_client.images.remove(tag)  # the push's tag on host a (the image itself stays)
    assert left.returncode == 0, left.stderr
    assert subprocess.run(["docker", "inspect", HOST_B], capture_output=True).returncode != 0
    assert (docker_client.info().get("Swarm") or {}).get("LocalNodeState") == "inactive"
    assert not walk.state.exists()
    if not had_gwbridge:
        assert not docker_client.networks.list(names=["docker_gwbridge"]), "the swarm's bridge is left"


def refused_before_anything_is_made(walk: Walk, client, gen: str) -> None:
    """A --place no swarm node is labelled with, a registry that does not answer: one line each, nothing made."""
    for folder, (old, new), said in (
        ("nowhere", ("worker2=b", "worker2=c"),
         "tflab: error: no swarm node is labelled tflab.host=c; label the node that should run it: "
         "docker node update --label-add tflab.host=c NODE"),
        ("silent", (f"127.0.0.1:{walk.port}", f"127.0.0.1:{free_port_base(1)}"), "does not answer (ConnectionError)"),
    ):
        lab, name = walk.share / folder, f"t{uuid.uuid4().hex[:10]}"
        argv = [new if arg == old else str(lab) if arg == str(walk.share / "two-hosts") else arg
                for arg in walk.argv(gen, name=name)]
        assert new in argv and str(lab) in argv, argv
        made = subprocess.run(argv, capture_output=True, text=True, env=walk.env)
        assert made.returncode == 0, made.stderr
        refused = subprocess.run([str(TFLAB), "up", "--lab", str(lab)], capture_output=True, text=True, env=walk.env)
        assert refused.returncode == 2 and said in refused.stderr.strip().splitlines()[-1], refused.stderr
        assert "Traceback" not in refused.stderr
        assert client.services.list(filters={"label": f"tflab.lab={templates.project_name(name, lab)}"}) == []
        assert not (lab / "docker-stack.yml").exists()


def a_lost_worker_ends_the_run_naming_it(walk: Walk, lab: Path, project: str) -> None:
    """worker2's container killed on host b mid-run: the run ends within 60 s, naming worker2."""
    config = lab / "tflab.yaml"
    doc = yaml.safe_load(config.read_text())
    doc["tasks"]["long"] = LONG
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    child = subprocess.Popen([str(TFLAB), "run", "long", "--lab", str(lab)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=walk.env)
    try:
        deadline = time.monotonic() + 240
        for line in child.stdout:
            if line.startswith("[worker2] ") and "global step" in line:
                break
            assert time.monotonic() < deadline, "worker2 printed no step"
        target = walk.in_b("ps", "-q", "--filter", f"label=com.docker.swarm.service.name={project}_worker2").split()
        assert len(target) == 1, target
        walk.in_b("kill", target[0])
        killed = time.monotonic()
        out, err = child.communicate(timeout=90)
        took = time.monotonic() - killed
    finally:
        child.kill()
    assert child.returncode not in (0, None), err
    assert took <= 60, took
    assert "tflab: worker2 failed" in out, (out[-2000:], err[-2000:])  # the verdict follows the summary (stdout)
