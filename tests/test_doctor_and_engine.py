"""`tflab doctor`, and engine trouble turned into advice."""

from __future__ import annotations

import pytest

from conftest import cli
from tflab import containers, engine
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


def test_doctor_with_the_engine_stopped_says_how_to_start_it(runner, monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/tflab-no-such-daemon.sock")
    result = runner.invoke(cli, ["doctor"])
    assert result.exit_code == 1
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("missing: Docker Engine: cannot reach the Docker daemon at unix:///tmp/tflab-no-such-daemon.sock")
    assert "fix: sudo dockerd &  (or: systemctl start docker)" in last


def test_commands_without_an_engine_are_one_line_advice(runner, monkeypatch, tmp_path) -> None:
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
    assert containers.start_advice("worker0", output).startswith(advice)


def test_compose_v1_alone_is_refused(monkeypatch) -> None:
    def only_v1(argv, **_kw):
        if argv[:2] == ["docker", "compose"]:
            raise engine.CommandError(list(argv), 1, "docker: 'compose' is not a docker command.")
        return "1.29.2\n"

    monkeypatch.setattr(engine.sys, "executable", "/nonexistent/python")
    with pytest.raises(EngineError, match="Compose v2 is needed"):
        engine.find_compose(only_v1)
