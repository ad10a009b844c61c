"""`tflab doctor`, and engine trouble turned into advice."""

from __future__ import annotations

import shutil

import docker.errors
import pytest
from conftest import cli

from tflab.engine import compose_up, daemon, doctor, node_image
from tflab.engine.builds import Progress
from tflab.errors import EngineError


@pytest.mark.docker
def test_doctor_without_gpus_still_passes_the_cpu_checks(runner, docker_client, no_nvidia_smi) -> None:
    # Nothing here depends on the host having compose: tflab does not need it.
    result = runner.invoke(cli, ["doctor"])
    assert result.exit_code == 0, result.stdout
    gpu_row = next(l for l in result.stdout.splitlines() if l.startswith("│ GPUs"))
    assert " note " in gpu_row and "no GPU (no working" in gpu_row
    assert "ready for CPU labs (no GPU here)" in result.stdout
    line = next(l for l in result.stdout.splitlines() if "Docker Engine" in l)
    assert " ok " in line


@pytest.mark.parametrize(("dockerd", "fix"), [
    ("/usr/sbin/dockerd", "fix: sudo dockerd &  (or: systemctl start docker)"),
    (None, "fix: apt-get install docker.io && dockerd &"),
])
def test_doctor_with_the_engine_stopped_says_how_to_start_it(runner, monkeypatch, no_nvidia_smi, dockerd, fix) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/tflab-no-such-daemon.sock")
    real_which = doctor.shutil.which
    monkeypatch.setattr(doctor.shutil, "which", lambda name: dockerd if name == "dockerd" else real_which(name))
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda _path: shutil._ntuple_diskusage(2**40, 0, 2**40))
    result = runner.invoke(cli, ["doctor"])
    assert result.exit_code == 1
    missing = [line for line in result.stdout.splitlines() if line.startswith("missing: ")]
    assert len(missing) == 1, result.stdout
    assert missing[0].startswith("missing: Docker Engine: cannot reach the Docker daemon at "
                                 "unix:///tmp/tflab-no-such-daemon.sock")
    assert missing[0].endswith(fix)


def test_commands_without_an_engine_are_one_line_advice(runner, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    assert runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2"]).exit_code == 0
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/tflab-no-such-daemon.sock")
    result = runner.invoke(cli, ["up", "--lab", str(tmp_path / "lab")])
    assert result.exit_code == 3
    assert result.stderr.startswith("tflab: error: cannot reach the Docker daemon at unix:///tmp/tflab-no-such-daemon.sock — is it running")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_command_outside_a_lab_says_so(runner, tmp_path) -> None:
    result = runner.invoke(cli, ["status", "--lab", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"tflab: error: no lab in {tmp_path} (no tflab.yaml); run `tflab gen` first or pass --lab DIR"


@pytest.mark.parametrize(("output", "advice"), [
    ("driver failed programming external connectivity on endpoint x: Bind for 127.0.0.1:20023 failed: port is "
     "already allocated", "worker0 cannot start: a port it publishes is already taken on the host"),
    ("No such image: tflab-node:abc", "worker0 cannot start: its image is missing; run `tflab build` first"),
    ("could not select device driver \"nvidia\" with capabilities: [[gpu]]",
     "worker0 reserves GPUs but this engine has no NVIDIA runtime; install the NVIDIA Container Toolkit"),
])
def test_engine_errors_at_start_become_advice(output: str, advice: str) -> None:
    assert compose_up.start_advice("worker0", output).startswith(advice)


def test_compose_v1_alone_is_refused(monkeypatch) -> None:
    def only_v1(argv, **_kw):
        if argv[:2] == ["docker", "compose"]:
            raise daemon.CommandError(list(argv), 1, "docker: 'compose' is not a docker command.")
        return "1.29.2\n"

    monkeypatch.setattr(daemon.sys, "executable", "/nonexistent/python")
    with pytest.raises(EngineError, match="Compose v2 is needed"):
        daemon.find_compose(only_v1)


class RefusingPulls:
    """An engine whose registry refuses every pull; it notes what it was asked for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.api = self

    def pull(self, repository: str, tag: str, stream: bool, decode: bool):
        self.asked.append((repository, tag))
        raise docker.errors.APIError("500 Server Error: Get \"http://localhost:5000/v2/\": connection refused")


@pytest.mark.parametrize(("ref", "asked", "advice"), [
    ("localhost:5000/tf:2.18", ("localhost:5000/tf", "2.18"),
     "cannot pull localhost:5000/tf:2.18 from the registry localhost:5000 (500 Server Error"),
    ("registry.example.com/team/tf", ("registry.example.com/team/tf", "latest"),
     "cannot pull registry.example.com/team/tf from the registry registry.example.com ("),
    ("tensorflow/tensorflow:2.18.0", ("tensorflow/tensorflow", "2.18.0"), "cannot pull tensorflow/tensorflow:2.18.0 ("),
])
def test_a_base_is_pulled_by_its_whole_name_and_a_failure_names_its_registry(ref, asked, advice) -> None:
    engine = RefusingPulls()
    with pytest.raises(EngineError) as failed:
        node_image.pull(engine, ref, Progress())
    assert engine.asked == [asked]
    message = str(failed.value)
    assert message.startswith(advice)
    assert ("--base local" in message) is (ref.startswith("tensorflow/")), "local is advice only where no registry was named"


class _Vanishing:
    """A docker SDK collection as the engine answers it while a swarm removes its tasks' containers:
    listed, then gone before the SDK inspects it (what failed `down` in CI with "No such container")."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def list(self, all: bool = False, filters: dict | None = None, ignore_removed: bool = False, **_kw):
        self.asked.append({"filters": filters, "ignore_removed": ignore_removed})
        if not ignore_removed:
            import docker.errors

            raise docker.errors.NotFound("No such container: 7e1c56b8bae4")
        return []


def test_down_is_not_failed_by_a_container_removed_while_it_is_listed() -> None:
    from types import SimpleNamespace

    from tflab.engine import compose_lab

    containers = _Vanishing()
    client = SimpleNamespace(containers=containers, networks=SimpleNamespace(list=lambda **_kw: []))
    assert compose_lab.down("tfrace", client) == (0, 0)
    assert containers.asked == [{"filters": {"label": "tflab.lab=tfrace"}, "ignore_removed": True}]


def test_a_gpu_lab_on_an_engine_that_cannot_give_gpus_stops_before_anything_is_built(runner, tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """`gen --gpus 0-3` (as for another host), then `up` here: one sentence naming what is missing and the choices,
    before a 7 GB GPU base is built; an engine with the NVIDIA runtime (or its hook, or its CDI spec) passes."""
    from conftest import cli

    from tflab.engine import bringup
    from tflab.errors import UserError
    from tflab.host import labfiles

    made = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "gpu"), "--nodes", "2", "--gpus", "0-3",
                               "--gpus-per-node", "2"])
    assert made.exit_code == 0, made.stderr
    lf = labfiles.open_lab(tmp_path / "gpu")
    monkeypatch.setattr(bringup.shutil, "which", lambda _name: None)
    monkeypatch.setattr(bringup, "CDI_SPECS", (str(tmp_path / "cdi"),))
    with pytest.raises(UserError) as refused:
        bringup.check_gpu_runtime(lf, {"Runtimes": {"io.containerd.runc.v2": {}, "runc": {}}})
    assert str(refused.value) == (
        "this lab's nodes own GPUs (ps0: 0,1; worker0: 2,3), and this engine cannot give a container a GPU (its "
        "runtimes: io.containerd.runc.v2, runc; no nvidia-container-runtime-hook, no NVIDIA CDI spec): install the "
        "NVIDIA Container Toolkit (`nvidia-ctk runtime configure --runtime=docker`), or make it a CPU lab: `tflab set "
        "--gpus-per-node 0`; nothing was built or started")
    bringup.check_gpu_runtime(lf, {"Runtimes": {"nvidia": {}, "runc": {}}})
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    bringup.check_gpu_runtime(lf, {"Runtimes": {"runc": {}}})
    cpu = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "cpu"), "--nodes", "2", "--gpus-per-node", "0"])
    assert cpu.exit_code == 0
    (tmp_path / "cdi" / "nvidia.yaml").unlink()
    bringup.check_gpu_runtime(labfiles.open_lab(tmp_path / "cpu"), {"Runtimes": {"runc": {}}})
