"""A lab on the real engine: up, exec, ssh between nodes, status, down, side by side."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import docker.errors
import pytest
import yaml
from conftest import cli

from tflab.engine.containers import SSHD_LISTENS, lab_containers
from tflab.host import labfiles

pytestmark = pytest.mark.docker


def exec_out(runner, lab: Path, node: str, *command: str) -> str:
    result = runner.invoke(cli, ["exec", "--lab", str(lab), node, "--", *command])
    assert result.exit_code == 0, (command, result.stdout, result.stderr)
    return result.stdout


def labelled(client, project: str) -> tuple[list, list]:
    label = {"label": f"tflab.lab={project}"}
    return client.containers.list(all=True, filters=label), client.networks.list(filters=label)


def test_four_node_lab_end_to_end(labs, runner, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "note.txt").write_text("from the host\n")
    lab = labs.gen(nodes=4, code=code)
    lf = labfiles.open_lab(lab)
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    assert "ready: 4 nodes" in up.stdout

    for node in lf.lab.nodes:
        env = dict(
            line.split("=", 1)
            for line in exec_out(runner, lab, node.name, "env").splitlines()
            if line.startswith(("TF_CONFIG=", "TFLAB_"))
        )
        assert json.loads(env["TF_CONFIG"]) == {
            "cluster": {"ps": ["ps0:2222"], "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]},
            "task": {"type": node.job, "index": node.task_index},
        }
        assert env["TFLAB_NODE"] == node.name
        assert env["TFLAB_JOB_NAME"] == node.job
        assert env["TFLAB_TASK_INDEX"] == str(node.task_index)
        assert env["TFLAB_PS_HOSTS"] == "ps0:2222"
        assert env["TFLAB_WORKER_HOSTS"] == "worker0:2222,worker1:2222,worker2:2222"
        assert env["TFLAB_NUM_GPUS"] == "0"
        assert exec_out(runner, lab, node.name, "cat", "/workspace/note.txt") == "from the host\n"
    assert exec_out(runner, lab, "worker0", "hostname").strip() == "worker0"
    # Nodes reach each other by name over SSH, without a password, as MPI-style tools expect.
    assert exec_out(runner, lab, "worker0", "ssh", "-o", "BatchMode=yes", "worker2", "hostname").strip() == "worker2"
    assert "TFLAB_NODE=worker2" in exec_out(runner, lab, "worker0", "ssh", "worker2", "env")

    # `status` asks each node now whether its sshd listens: healthy at once, after up (the engine checks no compose
    # node: its check every 3 s cost an idle node 0.03 of a CPU, and wrote two lines into its log each time).
    status = runner.invoke(cli, ["status", "--lab", str(lab)])
    assert status.exit_code == 0
    rows = [line for line in status.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 4 and all("running" in r and "healthy" in r and "unhealthy" not in r for r in rows), status.stdout
    assert all(c.attrs["Config"].get("Healthcheck") is None for c in lab_containers(labs.client, lf.project).values())
    none_yet = runner.invoke(cli, ["logs", "--lab", str(lab)])  # the program output of a run: there is none yet
    assert none_yet.exit_code == 2 and f"no run yet in {lf.runs_dir}" in none_yet.stderr, none_yet.stderr
    logs = runner.invoke(cli, ["logs", "--engine", "--lab", str(lab)])
    assert logs.exit_code == 0 and "Server listening on 0.0.0.0 port 22" in logs.stdout, logs.stdout
    assert "Connection closed by 127.0.0.1" not in logs.stdout, logs.stdout
    # the question status asks, where nothing listens on port 22 (the node's image, sshd not started): no
    image = lab_containers(labs.client, lf.project)["ps0"].image
    with pytest.raises(docker.errors.ContainerError) as refused:
        labs.client.containers.run(image, list(SSHD_LISTENS), entrypoint=[], remove=True, network_mode="none")
    assert refused.value.exit_status == 1

    # up again: nothing to do; after an edit, only the code is copied again.
    again = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert again.exit_code == 0 and "copied" not in again.stdout
    (code / "note.txt").write_text("edited\n")
    (code / "new.txt").write_text("new\n")
    edited = runner.invoke(cli, ["up", "--lab", str(lab)])
    copied = next(line for line in edited.stdout.splitlines() if line.startswith("copied "))
    assert copied == "copied code into every node", copied  # the lab's data (the digits) did not change
    assert exec_out(runner, lab, "worker1", "cat", "/workspace/note.txt") == "edited\n"
    assert exec_out(runner, lab, "worker1", "ls", "/data") == "digits.npz\n"
    # A file gone from the host goes from the nodes; nothing else is touched.
    (code / "new.txt").unlink()
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    assert exec_out(runner, lab, "worker2", "ls", "/workspace") == "note.txt\n"

    exec_out(runner, lab, "ps0", "sh", "-c", "echo checkpoint-from-ps0 > /runs/ps0.txt")
    # A killed node shows in status.
    containers, _ = labelled(labs.client, lf.project)
    next(c for c in containers if c.labels["tflab.node"] == "worker1").kill()
    time.sleep(1)
    status = runner.invoke(cli, ["status", "--lab", str(lab)])
    worker1 = next(line for line in status.stdout.splitlines() if "worker1" in line)
    assert "exited" in worker1 and "running" not in worker1, status.stdout

    down = runner.invoke(cli, ["down", "--lab", str(lab)])
    assert down.exit_code == 0, down.stderr
    assert labelled(labs.client, lf.project) == ([], [])
    assert (lf.runs_dir / "ps0.txt").read_text() == "checkpoint-from-ps0\n"
    quiet = runner.invoke(cli, ["down", "--lab", str(lab)])
    assert quiet.exit_code == 0 and quiet.stdout == ""


def test_two_labs_side_by_side(labs, runner) -> None:
    first, second = labs.gen(nodes=2), labs.gen(nodes=2)
    for lab in (first, second):
        assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    one, two = labfiles.open_lab(first), labfiles.open_lab(second)
    assert one.project != two.project
    assert exec_out(runner, first, "worker0", "hostname").strip() == "worker0"
    # Same node names, separate networks: ps0 of the first lab is not the second's.
    ip_one = exec_out(runner, first, "worker0", "getent", "hosts", "ps0").split()[0]
    ip_two = exec_out(runner, second, "worker0", "getent", "hosts", "ps0").split()[0]
    assert ip_one != ip_two
    # gen --force over a lab that is up says `down` first (not that its own ports are taken)
    ports = yaml.safe_load((first / "tflab.yaml").read_text())["ports"]
    again = runner.invoke(cli, ["gen", "--lab", str(first), "--nodes", "2", "--force", "--ssh-port-base",
                                str(ports["ssh_base"]), "--tensorboard-port-base", str(ports["tensorboard_base"])])
    assert again.exit_code == 2 and f"the lab in {first} is up: `tflab down --lab {first}` first" in again.stderr, \
        again.stderr
    assert runner.invoke(cli, ["down", "--lab", str(first)]).exit_code == 0
    assert labelled(labs.client, one.project) == ([], [])
    containers, networks = labelled(labs.client, two.project)
    assert len(containers) == 2 and all(c.status == "running" for c in containers) and len(networks) == 1
    # issue 30.12: a lab moved to another folder still finds (and removes) its own containers
    moved = second.parent / f"{second.name}-moved"
    second.rename(moved)
    assert labfiles.open_lab(moved).project == two.project
    assert exec_out(runner, moved, "worker0", "hostname").strip() == "worker0"
    gone = runner.invoke(cli, ["down", "--lab", str(moved)])
    assert gone.exit_code == 0, gone.stderr
    assert labelled(labs.client, two.project) == ([], [])


def test_exec_of_unknown_node_or_task_is_one_line(labs, runner) -> None:
    lab = labs.gen(nodes=2)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    node = runner.invoke(cli, ["exec", "--lab", str(lab), "worker7", "--", "true"])
    assert node.exit_code == 2
    assert node.stderr.strip() == "tflab: error: no node 'worker7' in this lab; its nodes are ps0, worker0"
    task = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "trian"])
    assert task.exit_code == 2
    assert task.stderr.strip() == ("tflab: error: no task 'trian' in tflab.yaml: did you mean 'train'? (its tasks are: "
                                   "allreduce, hello, ps_strategy, single, train)")
    failing = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "--", "sh", "-c", "exit 7"])
    assert failing.exit_code == 7


def node_config(client, project: str, node: str) -> dict:
    """What a node is made of, as the engine reports it (the fields the compose file decides)."""
    container = next(c for c in client.containers.list(all=True, filters={"label": f"tflab.lab={project}"})
                     if c.labels.get("tflab.node") == node)
    attrs, host = container.attrs, container.attrs["HostConfig"]
    network = next(iter(attrs["NetworkSettings"]["Networks"].items()))
    return {
        "name": attrs["Name"],
        "image": attrs["Config"]["Image"],
        "hostname": attrs["Config"]["Hostname"],
        "working_dir": attrs["Config"]["WorkingDir"],
        "env": sorted(e for e in attrs["Config"]["Env"] if e.startswith(("TF", "PYTHON"))),
        "labels": {k: v for k, v in attrs["Config"]["Labels"].items() if k.startswith("tflab.") and k != "tflab.spec"},
        "ports": host["PortBindings"],
        "mounts": sorted((m["Source"], m["Destination"], m["RW"]) for m in attrs["Mounts"]),
        "shm": host["ShmSize"],
        "ulimits": sorted((u["Name"], u["Soft"], u["Hard"]) for u in host["Ulimits"] or []),
        "init": host["Init"],
        "restart": host["RestartPolicy"]["Name"],
        "cap_add": sorted(c.removeprefix("CAP_") for c in host["CapAdd"] or []),
        "network": network[0],
        "aliases": sorted({a for a in network[1]["Aliases"] or [] if not re.fullmatch(r"[0-9a-f]{12}", a)}),
    }


def test_tflab_starts_the_nodes_plain_docker_compose_would(labs, runner, compose_argv) -> None:
    lab = labs.gen("--link-rate", "1gbit", nodes=2)
    lf = labfiles.open_lab(lab)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    ours = {node: node_config(labs.client, lf.project, node) for node in lf.lab.names}
    # compose sees the nodes tflab started as its own
    listed = subprocess.run([*compose_argv, "-f", str(lf.compose_path), "ps", "--format", "{{.Service}}"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(listed) == sorted(lf.lab.names)
    assert runner.invoke(cli, ["down", "--lab", str(lab)]).exit_code == 0
    subprocess.run([*compose_argv, "-f", str(lf.compose_path), "up", "-d"], capture_output=True, check=True)
    theirs = {node: node_config(labs.client, lf.project, node) for node in lf.lab.names}
    assert ours == theirs
    assert ours["worker0"]["cap_add"] == ["NET_ADMIN", "SYS_PTRACE"]
    assert ours["worker0"]["aliases"] == sorted(["worker0", f"{lf.project}-worker0-1"])


def test_a_gpu_lab_on_this_gpu_less_engine_is_refused_in_one_line_with_nothing_built_or_left(labs, runner,
                                                                                              docker_client) -> None:
    lab = labs.gen("--gpus", "0-3", "--gpus-per-node", "2", nodes=2)
    images = {image.id for image in docker_client.images.list()}
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 2, up.stdout + up.stderr
    assert up.stderr.startswith("tflab: error: this lab's nodes own GPUs (ps0: 0,1; worker0: 2,3), and this engine "
                                "cannot give a container a GPU") and len(up.stderr.strip().splitlines()) == 1
    assert "tflab set --gpus-per-node 0" in up.stderr and "Service(" not in up.stderr
    assert {image.id for image in docker_client.images.list()} == images, "nothing built"
    lf = labfiles.open_lab(lab)
    assert not docker_client.containers.list(all=True, filters={"label": f"tflab.lab={lf.project}"})
    assert not docker_client.networks.list(filters={"label": f"tflab.lab={lf.project}"})
