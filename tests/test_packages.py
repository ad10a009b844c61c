"""A lab's own packages and TensorFlow version: tflab.yaml, gen's options, the tag, the install's command."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli

from tflab.engine import bringup, packages
from tflab.errors import UserError
from tflab.host import buildsettings, labfiles
from tflab.plan import config as cfg
from tflab.plan import labfile


@pytest.fixture(autouse=True)
def free_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)


def test_gen_records_pip_apt_the_requirements_file_and_the_version(runner, tmp_path: Path) -> None:
    code = tmp_path / "project"
    code.mkdir()
    (code / "train.py").write_text("import tabulate\n")
    (code / "requirements.txt").write_text("tabulate==0.9.0\n")
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", "--code", str(code),
                                 "--pip", "toolz", "--pip", "numpy<3", "--apt", "jq", "--tensorflow", "2.19.0"])
    assert result.exit_code == 0, result.stderr
    doc = yaml.safe_load((tmp_path / "lab" / "tflab.yaml").read_text())
    assert doc["packages"] == {"pip": ["toolz", "numpy<3", "-r requirements.txt"], "apt": ["jq"]}
    assert doc["image"]["tensorflow"] == "2.19.0"
    lf = labfiles.open_lab(tmp_path / "lab")
    assert lf.config.packages == cfg.Packages(pip=("toolz", "numpy<3", "-r requirements.txt"), apt=("jq",))
    assert "FROM ${BASE_IMAGE}" in (lf.image_dir / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=tensorflow/tensorflow:2.19.0\n" in (lf.image_dir / "Dockerfile").read_text()
    context = lf.image_context()
    assert context["requirements/requirements.txt"] == b"tabulate==0.9.0\n"


def test_the_tag_changes_with_the_packages_and_the_requirements_not_with_the_code(runner, tmp_path: Path) -> None:
    code = tmp_path / "project"
    code.mkdir()
    (code / "requirements.txt").write_text("tabulate\n")
    assert runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", "--code", str(code)]).exit_code == 0
    first = labfiles.open_lab(tmp_path / "lab").image_tag("base")
    (code / "train.py").write_text("print('a code change')\n")
    assert labfiles.open_lab(tmp_path / "lab").image_tag("base") == first, "code is copied, not built in"
    (code / "requirements.txt").write_text("tabulate\ntoolz\n")
    second = labfiles.open_lab(tmp_path / "lab").image_tag("base")
    assert second != first
    path = tmp_path / "lab" / "tflab.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["packages"]["apt"] = ["jq"]
    path.write_text(yaml.safe_dump(doc))
    assert labfiles.open_lab(tmp_path / "lab").image_tag("base") not in (first, second)


@pytest.mark.parametrize(("args", "message"), [
    (["--pip", "pandas\nRUN x"], "is not a pip requirement"),
    (["--pip", "--index-url=http://evil"], "is not a pip requirement"),
    (["--pip", "-r ../../etc/passwd"], "-r names a requirements file inside the code folder"),
    (["--pip", "-r missing.txt"], "--pip '-r missing.txt': no such file in the code folder"),
    (["--apt", "Foo Bar"], "--apt 'Foo Bar' is not a Debian/Ubuntu package name"),
    (["--apt", "jq;rm"], "is not a Debian/Ubuntu package name"),
    (["--tensorflow", "latest"], "--tensorflow 'latest' is not a TensorFlow version (such as 2.15.0)"),
    (["--tensorflow", "2.10.0", "--base", "local"], "TensorFlow 2.10.0 has no wheels for Python"),
])
def test_bad_packages_and_versions_are_refused_at_gen(runner, tmp_path: Path, args, message, monkeypatch) -> None:
    monkeypatch.setattr(buildsettings, "read_apt_sources",
                        lambda: {"sources.list": "deb http://deb.debian.org/debian bookworm main\n"})
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", *args])
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "lab").exists()


@pytest.mark.parametrize(("text", "message"), [
    ("packages: {pip: pandas}", "packages.pip must be a list of texts"),
    ('packages: {pip: ["pandas\\nx"]}', "packages.pip 'pandas\\nx' is not a pip requirement"),
    ("packages: {npm: [x]}", "packages.npm is not a key tflab knows"),
    ("image: {tensorflow: 2.15}", "image.tensorflow must be a text, not float 2.15"),
    ("image: {tensorflow: 'two'}", "image.tensorflow: --tensorflow 'two' is not a TensorFlow version"),
])
def test_bad_packages_in_tflab_yaml_name_their_key(text: str, message: str) -> None:
    with pytest.raises(UserError) as caught:
        labfile.from_yaml(text)
    assert message in str(caught.value)


def test_a_pinned_version_the_index_lacks_for_the_bases_python_is_refused_naming_what_it_has(monkeypatch) -> None:
    monkeypatch.setattr(buildsettings, "index_versions", lambda run, package, python: ["2.21.0", "2.20.0"])
    with pytest.raises(UserError, match=r"TensorFlow 2.19.0 cannot be installed \(tflab's own base: noble, Python "
                                        r"3.12\): the index has tensorflow-cpu 2.21.0, 2.20.0 for that Python"):
        bringup.check_release("2.19.0", False, (3, 12), "noble")
    bringup.check_release("2.20", False, (3, 12), "noble")  # 2.20: the newest 2.20.x
    with pytest.raises(UserError, match=r"TensorFlow 2.19.0 has no wheels for Python 3.13 .* pick 2.20 to 2.21"):
        bringup.check_release("2.19.0", False, (3, 13), "trixie")
    assert cfg.tensorflow_requirement(False, "2.20") == "tensorflow-cpu==2.20.*"
    assert cfg.local_base(False, "2.19.0") == "tflab-base:cpu-tf2.19.0"
    assert cfg.official_base(True, "2.19.0") == "tensorflow/tensorflow:2.19.0-gpu"


def test_the_install_command_holds_names_and_paths_only() -> None:
    argv = packages.install_argv(cfg.Packages(pip=("tabulate", "-r requirements.txt"), apt=("jq", "graphviz")))
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["tflab-packages", buildsettings.BUILD_MOUNT, "jq graphviz", "",
                                                     "tabulate", "-r", "requirements.txt"]
    assert packages.install_argv(cfg.Packages(), keras=2)[3:] == ["tflab-packages", buildsettings.BUILD_MOUNT, "",
                                                                  "--keras 2"]
    pip_output = ("Collecting tabulatte\n  ERROR: Could not find a version that satisfies the requirement tabulatte "
                  "(from versions: none)\nERROR: No matching distribution found for tabulatte\n")
    assert packages.failure_line(pip_output).startswith("ERROR: Could not find a version that satisfies the "
                                                        "requirement tabulatte")
    assert packages.failure_line("Reading package lists...\nE: Unable to locate package jqq\n") == \
        "E: Unable to locate package jqq"


def test_the_files_naming_the_packages_are_told_apart_from_the_node_files_and_travel_with_their_folders() -> None:
    """On tflab's own base (which carries the node files), a packages lab's stage is the base itself, and only the
    files naming the packages (the record `status` reads, the requirements) go into the install's container:
    an archive put into a container makes no folder, so the requirements' folder travels in it first."""
    import io
    import tarfile
    from types import SimpleNamespace

    from tflab.engine.node_image import tar_context
    from tflab.render import image_files

    # the fields packages_files reads
    config = SimpleNamespace(packages=cfg.Packages(pip=("-r requirements.txt",), apt=("jq",)), tensorflow=None,
                             installs=True, keras=None)
    named = image_files.packages_files(config, {"requirements.txt": b"tabulate\n", "extra/more.txt": b"toolz\n"})
    assert sorted(named) == ["packages.json", "requirements/extra/more.txt", "requirements/requirements.txt"]
    assert all(image_files.is_packages_file(name) for name in named)
    assert not any(image_files.is_packages_file(name) for name in [*image_files.node_files(), "Dockerfile"])
    with tarfile.open(fileobj=io.BytesIO(tar_context(named).getvalue())) as tar:
        members = [(m.name, m.isdir()) for m in tar.getmembers()]
    assert members == [("requirements", True), ("requirements/extra", True), ("packages.json", False),
                       ("requirements/extra/more.txt", False), ("requirements/requirements.txt", False)]
