"""A new lab from gen's options (host/newlab.py), called directly: what it writes, and nothing on a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import free_port_base, snapshot

from tflab.errors import UserError
from tflab.host import newlab
from tflab.host.newlab import LabRequest, make_lab


def request(root: Path, **options) -> LabRequest:
    base = free_port_base(12)
    return LabRequest(root=root, ssh_port_base=base, tensorboard_port_base=base + 6, name="direct", **options)


def test_a_lab_is_written_from_the_request(tmp_path: Path, no_nvidia_smi) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("tabulate\n")
    made = make_lab(request(tmp_path / "lab", nodes=3, code=str(code), pip=["toolz", "toolz"], apt=["jq"]))
    saved = yaml.safe_load((tmp_path / "lab" / "tflab.yaml").read_text())
    assert saved["name"] == "direct" and saved["code"] == "../code" and saved["data"] == "data"
    assert saved["packages"] == {"pip": ["toolz", "-r requirements.txt"], "apt": ["jq"]}
    assert [n.name for n in made.files.lab.nodes] == ["ps0", "worker0", "worker1"]
    assert made.gpus == []
    assert (tmp_path / "lab" / "data" / "digits.npz").is_file(), "no --data: the example's digits"


@pytest.mark.parametrize(("options", "message"), [
    ({"shm_size": "lots"}, "--shm-size 'lots'"),
    ({"data_mode": "link"}, "--data-mode must be copy or mount, not 'link'"),
    ({"place": ["ps0=a"]}, "--place and --registry are for swarm labs: add --target swarm"),
    ({"target": "swarm", "bind": "0.0.0.0", "place": ["ps9=a"]},
     "--place 'ps9=a': no node 'ps9' in this lab; its nodes are ps0, worker0, worker1, worker2"),
    ({"target": "swarm", "bind": "0.0.0.0", "place": ["ps0"]}, "--place 'ps0': write NODE=HOST"),
    ({"code": "no/such/folder"}, "--code no/such/folder: no such folder"),
    ({"pip": ["-r other.txt"]}, "--pip '-r other.txt': no such file in the code folder"),
])
def test_a_refused_request_writes_nothing(tmp_path: Path, no_nvidia_smi, options: dict, message: str) -> None:
    root = tmp_path / "lab"
    root.mkdir()
    (root / "notes.txt").write_text("mine\n")
    before = snapshot(root)
    with pytest.raises(UserError) as refused:
        make_lab(request(root, **options))
    assert message in str(refused.value), str(refused.value)
    assert "\n" not in str(refused.value)
    assert snapshot(root) == before


def test_an_existing_lab_is_kept_unless_forced(tmp_path: Path, no_nvidia_smi) -> None:
    make_lab(request(tmp_path / "lab", nodes=2))
    before = snapshot(tmp_path / "lab")
    with pytest.raises(UserError, match=r"^a lab already exists in .*/lab; pass --force to overwrite it$"):
        make_lab(request(tmp_path / "lab", nodes=3))
    assert snapshot(tmp_path / "lab") == before
    forced = make_lab(request(tmp_path / "lab", nodes=3, force=True))
    assert [n.name for n in forced.files.lab.nodes] == ["ps0", "worker0", "worker1"]


def test_the_helpers_read_options_as_gen_documents_them(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    assert newlab.lab_relative(str(tmp_path / "code"), tmp_path / "lab", "--code") == "../code"
    assert newlab.lab_relative(None, tmp_path, "--code") is None
    assert newlab.placements(["ps0=a", "worker0=b"], ["ps0", "worker0"]) == {"ps0": "a", "worker0": "b"}
    packages = newlab.lab_packages(["six"], ["jq", "jq"], None)  # the bundled examples: no requirements file
    assert (packages.pip, packages.apt) == (("six",), ("jq",))
    (tmp_path / "code" / "requirements.txt").write_text("six\n")
    packages = newlab.lab_packages(["-r requirements.txt"], [], tmp_path / "code")
    assert packages.pip == ("-r requirements.txt",), "named once, though both given and found"
