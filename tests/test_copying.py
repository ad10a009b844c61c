"""Code and data into the nodes (engine/copying.py) on its own: what travels to each node on each `up`.

A node here is a folder: its copy target unpacks the archive at its root and removes the paths it is
told to, as the engine's put_archive at / and the `rm -f` in the node do."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from conftest import cli

from tflab.engine.builds import Progress
from tflab.engine.copying import STATE_FILE, Copier, CopyTarget
from tflab.errors import UserError
from tflab.host import labfiles


class Node:
    """A node as a folder, and every archive and removal it was sent."""

    def __init__(self, root: Path, ident: str) -> None:
        self.root, self.ident = root, ident
        self.received: list[list[str]] = []
        self.removed: list[tuple[str, ...]] = []
        root.mkdir(parents=True)

    def target(self) -> CopyTarget:
        def put(archive: Path, removed: tuple[str, ...]) -> None:
            with tarfile.open(archive) as tar:
                self.received.append(sorted(tar.getnames()))
                tar.extractall(self.root)  # an archive the copier made of the test's own files
            for path in removed:
                (self.root / path.lstrip("/")).unlink(missing_ok=True)
            self.removed.append(removed)

        return CopyTarget(self.ident, put)

    def files(self) -> dict[str, str]:
        return {str(p.relative_to(self.root)): p.read_text() for p in sorted(self.root.rglob("*")) if p.is_file()}


@pytest.fixture
def lab(tmp_path: Path, runner, no_nvidia_smi) -> Path:
    code, data = tmp_path / "code", tmp_path / "data"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('train')\n")
    (code / "pkg" / "util.py").write_text("X = 1\n")
    data.mkdir()
    (data / "set.csv").write_text("1,2\n")
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", "--code", str(code),
                                 "--data", str(data)])
    assert result.exit_code == 0, result.stderr
    return tmp_path / "lab"


def up(lab: Path, *nodes: Node) -> tuple[list[str], list[str]]:
    """One `up`'s copies: what was copied (kind→node) and the steps it reported."""
    steps: list[str] = []
    copier = Copier(labfiles.open_lab(lab), Progress(step=steps.append))
    for node in nodes:
        copier.copy(node.ident, node.target())
    return copier.finish(), steps


def test_the_first_up_copies_code_and_data_and_the_next_only_what_changed(lab: Path, tmp_path: Path) -> None:
    a, b = Node(tmp_path / "a", "id-a"), Node(tmp_path / "b", "id-b")
    copied, steps = up(lab, a, b)
    assert copied == ["code→id-a", "code→id-b", "data→id-a", "data→id-b"]
    assert steps == ["copying code and data into the nodes"]
    expected = {"workspace/train.py": "print('train')\n", "workspace/pkg/util.py": "X = 1\n", "data/set.csv": "1,2\n"}
    assert a.files() == expected and b.files() == expected

    # Nothing changed: nothing travels, nothing is said.
    assert up(lab, a, b) == ([], [])
    assert len(a.received) == 1

    # One file edited, one added, one removed on the host: only those two travel, the third goes.
    code = tmp_path / "code"
    (code / "train.py").write_text("print('train, edited')\n")
    os.utime(code / "train.py", ns=(1, 1))  # a different mtime even on a coarse clock
    (code / "new.py").write_text("new\n")
    (code / "pkg" / "util.py").unlink()
    copied, steps = up(lab, a, b)
    assert copied == ["code→id-a", "code→id-b"] and steps == ["copying code into the nodes"]
    assert a.received[-1] == ["workspace/new.py", "workspace/train.py"]
    assert a.removed[-1] == ("/workspace/pkg/util.py",)
    assert a.files() == {"workspace/train.py": "print('train, edited')\n", "workspace/new.py": "new\n",
                         "data/set.csv": "1,2\n"}
    assert b.files() == a.files()


def test_a_new_container_gets_everything_and_a_removed_one_is_forgotten(lab: Path, tmp_path: Path) -> None:
    a = Node(tmp_path / "a", "id-a")
    up(lab, a)
    # worker0 was made again (a new container id): it holds nothing, so it gets everything.
    again = Node(tmp_path / "a2", "id-a2")
    copied, _ = up(lab, again)
    assert copied == ["code→id-a2", "data→id-a2"]
    assert again.files() == a.files()
    held = json.loads((lab / STATE_FILE).read_text())
    assert sorted(held) == ["id-a2"], "a container not in this up is not remembered"


def test_a_missing_data_folder_is_one_line_before_anything_is_copied(lab: Path, tmp_path: Path) -> None:
    (tmp_path / "data" / "set.csv").unlink()
    (tmp_path / "data").rmdir()
    with pytest.raises(UserError, match=rf"^the lab's data folder {tmp_path / 'data'} does not exist$"):
        Copier(labfiles.open_lab(lab), Progress())
