"""`tflab set`: an existing lab's settings changed with gen's options; everything not named kept; bad input refused
in one line, exit 2, tflab.yaml unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli


@pytest.fixture
def lab(runner, tmp_path: Path) -> Path:
    folder = tmp_path / "lab"
    made = runner.invoke(cli, ["gen", "--lab", str(folder), "--nodes", "3", "--ps", "0", "--gpus-per-node", "0",
                               "--ssh-port-base", "31022", "--tensorboard-port-base", "31122", "--name", "mine"])
    assert made.exit_code == 0, made.stderr
    return folder


def test_set_changes_what_it_is_told_and_keeps_the_rest(runner, lab: Path) -> None:
    """The cure of a Keras 3 failure, followed on the lab as it is: the topology, code, ports, name and tasks stay."""
    before = yaml.safe_load((lab / "tflab.yaml").read_text())
    done = runner.invoke(cli, ["set", "--lab", str(lab), "--keras", "2", "--task", "main=python /workspace/main.py"])
    assert done.exit_code == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"changed in {lab.resolve() / 'tflab.yaml'}:", "  image.keras: null → 2",
        "  tasks.main: (none) → python /workspace/main.py", f"next: tflab up --lab {lab}"]
    after = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert after["image"]["keras"] == 2 and after["tasks"]["main"] == "python /workspace/main.py"
    for key in ("name", "topology", "ports", "code", "data", "host", "gpus"):
        assert after[key] == before[key], key
    assert {k: v for k, v in after["tasks"].items() if k != "main"} == before["tasks"]
    again = runner.invoke(cli, ["set", "--lab", str(lab), "--keras", "2"])
    assert (again.exit_code, again.stdout) == (0, "nothing changed: the lab has these settings already\n")
    back = runner.invoke(cli, ["set", "--lab", str(lab), "--keras", "none", "--drop-task", "main", "--nodes", "4",
                               "--chief"])
    assert back.exit_code == 0, back.stderr
    assert "  topology.nodes: 3 → 4" in back.stdout and "  image.keras: 2 → null" in back.stdout
    final = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert final["topology"]["nodes"] == 4 and final["topology"]["chief"] is True and "main" not in final["tasks"]


@pytest.mark.parametrize("argv, said", [
    (["--kerass", "2"], "tflab: error: No such option: --kerass Did you mean --keras? (see `tflab set --help`)"),
    (["--keras", "3"], "tflab: error: --keras '3': the choice is 2"),
    (["--nodes", "0"], "tflab: error: --nodes must be 1 or more, not 0"),
    (["--cpus-per-node", "lots"], "lots"),
    (["--link-rate", "fast"], "fast"),
    (["--task", "train"], "tflab: error: --task 'train': write NAME=COMMAND"),
    (["--task", "my task=echo"], "is not a word"),
    (["--drop-task", "nope"], "tflab: error: --drop-task nope: the lab has no task 'nope'"),
    (["--gpus-per-node", "2"], "needs GPUs"),
    ([], "tflab: error: name a setting to change"),
])
def test_bad_input_for_set_is_one_line_exit_2_and_changes_nothing(runner, lab: Path, argv: list[str], said: str) -> None:
    before = (lab / "tflab.yaml").read_text()
    done = runner.invoke(cli, ["set", "--lab", str(lab), *argv])
    assert done.exit_code == 2, done.stdout + done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (lab / "tflab.yaml").read_text() == before


def test_set_on_a_folder_with_no_lab_says_so(runner, tmp_path: Path) -> None:
    done = runner.invoke(cli, ["set", "--lab", str(tmp_path), "--keras", "2"])
    assert done.exit_code == 2
    assert done.stderr.strip() == (f"tflab: error: no lab in {tmp_path} (no tflab.yaml); run `tflab gen` first or pass "
                                   "--lab DIR")
