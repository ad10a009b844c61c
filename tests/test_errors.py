"""One error boundary: whatever goes wrong reaches the user as one line (the traceback only with -v)."""

from __future__ import annotations

import os
from pathlib import Path

import docker.errors
import pytest
import requests
from conftest import cli

from tflab.engine import daemon
from tflab.engine.compose_lab import ComposeLab
from tflab.host.filetree import manifest, pack


@pytest.fixture
def lab(runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "lab"
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    assert runner.invoke(cli, ["gen", "--lab", str(folder), "--nodes", "2"]).exit_code == 0
    monkeypatch.setattr(daemon, "client", lambda: object())  # no engine needed: `down` is made to fail below
    return folder


@pytest.mark.parametrize(("error", "code", "line"), [
    (docker.errors.APIError("500 Server Error", explanation="network lab not found"), 3,
     "tflab: error: the Docker engine refused: network lab not found"),
    (requests.exceptions.ConnectionError("Connection aborted"), 3,
     "tflab: error: cannot reach the Docker daemon at "),
    (PermissionError(13, "Permission denied", "/var/run/docker.sock"), 1,
     "tflab: error: Permission denied (/var/run/docker.sock)"),
    (BrokenPipeError(32, "Broken pipe"), 1,
     "tflab: error: a process tflab was writing to ended before reading it all (Broken pipe); `tflab -v ...` shows which"),
    (RuntimeError("something unforeseen"), 1,
     "tflab: error: internal error: RuntimeError: something unforeseen (`tflab -v ...` shows where)"),
])
def test_any_error_is_one_line_with_an_exit_code(runner, lab: Path, monkeypatch: pytest.MonkeyPatch,
                                                 error: Exception, code: int, line: str) -> None:
    def failing(self):
        raise error

    monkeypatch.setattr(ComposeLab, "down", failing)
    result = runner.invoke(cli, ["down", "--lab", str(lab)])
    assert result.exit_code == code
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(line), result.stderr
    assert "Traceback" not in result.stderr
    verbose = runner.invoke(cli, ["-v", "down", "--lab", str(lab)])
    assert verbose.exit_code == code and "Traceback (most recent call last)" in verbose.stderr


def test_a_dangling_link_in_the_code_folder_is_left_out(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    os.symlink(tmp_path / "gone", code / "dangling.py")
    (code / "data").mkdir()
    os.symlink(code / "train.py", code / "data" / "alias.py")
    assert sorted(manifest(code)) == ["data/alias.py", "train.py"]
    archive = pack([(code / "data" / "alias.py", "workspace/data/alias.py")])
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.getmember("workspace/data/alias.py")
        assert member.isfile() and tar.extractfile(member).read() == b"print(1)\n"  # links are followed
    archive.unlink()


@pytest.mark.parametrize("argv", [
    ["exec", "worker9", "--lab", "{lab}", "--", "hostname", "--lab", "x"],
    ["exec", "--lab", "{lab}", "worker9", "--", "hostname"],
    ["exec", "worker9", "--via=docker", "--lab", "{lab}", "train"],
    ["ssh", "worker9", "--lab", "{lab}"],
])
def test_exec_and_ssh_read_their_options_after_the_node_up_to_the_dashes(runner, lab: Path, argv: list[str]) -> None:
    result = runner.invoke(cli, [word.replace("{lab}", str(lab)) for word in argv])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == "tflab: error: no node 'worker9' in this lab; its nodes are ps0, worker0", result.stderr


def test_the_words_after_the_dashes_stay_the_commands() -> None:
    from tflab.cli.app import hoist_options

    params = cli.commands["exec"].params
    assert hoist_options(params, ["worker0", "--lab", "d", "--no-tty", "--", "ls", "--lab", "e"]) == [
        "--lab", "d", "--no-tty", "worker0", "--", "ls", "--lab", "e"]
    assert hoist_options(params, ["worker0", "train", "--resume", "--grace=5"]) == [
        "--resume", "--grace=5", "worker0", "train"]
    assert hoist_options(params, ["worker0", "--", "python", "-c", "1"]) == ["worker0", "--", "python", "-c", "1"]


@pytest.mark.parametrize(("argv", "message"), [
    # issue 30.13: each says what is wrong with the value, before the engine is asked anything
    (["exec", "worker0", "--grace", "-3", "--lab", "{lab}", "train"], "--grace must be 0 or more seconds, not -3.0"),
    (["exec", "worker0", "--grace", "nan", "--lab", "{lab}", "train"], "--grace must be 0 or more seconds, not nan"),
    (["run", "train", "--grace", "inf", "--lab", "{lab}"], "--grace must be 0 or more and --timeout more than 0"),
    (["run", "train", "--fault", "kill worker0 at step -5", "--lab", "{lab}"],
     "`at step` needs a step number (a whole number, 0 or more), not '-5'"),
    (["top", "--interval", "nan", "--lab", "{lab}"], "--interval must be between 0.2 and 3600 seconds, not nan"),
    (["gen", "--lab", "{lab}/other", "--bind", "1.2.3.999"], "--bind '1.2.3.999' is not an IP address"),
])
def test_bad_values_are_named_before_the_engine_is_asked(runner, lab: Path, monkeypatch, argv, message) -> None:
    def no_engine():
        raise AssertionError("the engine was asked")

    monkeypatch.setattr(daemon, "client", no_engine)
    result = runner.invoke(cli, [word.replace("{lab}", str(lab)) for word in argv])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.strip() == f"tflab: error: {message}" or message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_a_mistyped_command_is_told_the_closest_one_and_version_says_tflabs(runner) -> None:
    from conftest import cli

    typo = runner.invoke(cli, ["rnu"])
    assert typo.exit_code == 2
    assert typo.stderr == "tflab: error: no command 'rnu'; did you mean 'run'? (`tflab --help` lists them)\n"
    far = runner.invoke(cli, ["zzz"])
    assert far.exit_code == 2 and far.stderr.startswith("tflab: error: No such command 'zzz'")
    version = runner.invoke(cli, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("tflab ") and "guard protocol" in version.stdout
