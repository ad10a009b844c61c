"""Keras 2 for today's TensorFlow, and one TensorFlow per image: tflab.yaml's `image.keras`, gen's `--keras 2`, the
variable every node sees on every target, the refusal of a pin with no tf-keras, and the node's one_tensorflow.py
(run here on fake installed distributions, under this Python and 3.6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import cli
from test_guard import old_python

from tflab import resources
from tflab.engine import packages
from tflab.errors import UserError
from tflab.host import buildsettings, labfiles
from tflab.plan import config as cfg
from tflab.plan import labfile
from tflab.plan.topology import Topology
from tflab.render import image_files, k8s, templates

TRAIN = cfg.Task("train", "python /workspace/main.py")


@pytest.fixture(autouse=True)
def free_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)


def test_gen_keras_2_is_kept_in_tflab_yaml_and_every_node_sees_it(runner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "3", "--keras", "2"])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load((tmp_path / "lab" / "tflab.yaml").read_text())["image"]["keras"] == 2
    lf = labfiles.open_lab(tmp_path / "lab")
    assert lf.config.keras == 2 and lf.config.installs
    compose = yaml.safe_load(lf.compose_path.read_text())
    assert {node["environment"]["TF_USE_LEGACY_KERAS"] for node in compose["services"].values()} == {"1"}
    assert json.loads(lf.image_context()[image_files.PACKAGES_FILE])["keras"] == 2


def test_without_keras_the_nodes_have_their_tensorflows_own(runner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2"])
    assert result.exit_code == 0, result.stderr
    lf = labfiles.open_lab(tmp_path / "lab")
    assert lf.config.keras is None and not lf.config.installs
    assert "TF_USE_LEGACY_KERAS" not in lf.compose_path.read_text()
    assert image_files.PACKAGES_FILE not in lf.image_context(), "the image is the base's, as before"


def test_keras_2_changes_the_node_images_tag(tmp_path: Path) -> None:
    plain = cfg.LabConfig(name="k", topology=Topology(nodes=2))
    keras2 = cfg.LabConfig(name="k", topology=Topology(nodes=2), keras=2)
    assert image_files.image_tag(image_files.image_context(plain)) != image_files.image_tag(
        image_files.image_context(keras2))


@pytest.mark.parametrize(("args", "message"), [
    (["--keras", "3"], "--keras '3': the choice is 2"),
    (["--keras", "two"], "--keras 'two': the choice is 2"),
])
def test_another_keras_is_refused_at_gen(runner, tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "lab").exists()


@pytest.mark.parametrize(("text", "message"), [
    ("image: {keras: 3}\n", "image.keras 3: the choice is 2"),
    ("image: {keras: true}\n", "image.keras True: the choice is 2"),
    ("image: {kerass: 2}\n", "image.kerass is not a key tflab knows (did you mean keras?)"),
])
def test_a_wrong_keras_in_tflab_yaml_names_its_key(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        labfile.from_yaml("topology: {nodes: 2}\n" + text, "tflab.yaml")


def test_a_pinned_tensorflow_without_its_tf_keras_is_refused_before_building(runner, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buildsettings, "index_versions",
                        lambda run, package, python: ["2.21.0", "2.20.1", "2.19.0"] if package == "tf-keras" else None)
    result = runner.invoke(cli, ["gen", "--lab", str(tmp_path / "lab"), "--nodes", "2", "--keras", "2",
                                 "--tensorflow", "2.22.0"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.strip() == ("tflab: error: --keras 2 with TensorFlow 2.22.0: the package index has no tf-keras 2.22 "
                                     "(it has 2.21.0, 2.20.1, 2.19.0); pin a TensorFlow it has one for, or leave "
                                     "--keras out (Keras 3)")
    assert not (tmp_path / "lab").exists()
    for fine in ("2.20", "2.19.1", "2.15.0"):  # 2.15's own Keras is Keras 2: nothing to install
        cfg.check_tf_keras(fine, ["2.21.0", "2.20.1", "2.19.0"])
    cfg.check_tf_keras("2.30.0", None)  # the index cannot be asked: pip says it at the build, if it must


def test_keras_2_on_the_other_targets(tmp_path: Path) -> None:
    config = cfg.LabConfig(name="k", topology=Topology(nodes=3, bind="0.0.0.0"), memlock=-1, keras=2,
                           tasks={"train": TRAIN})
    lf = labfiles.write_lab(config, tmp_path / "lab", force=False)
    stack = yaml.safe_load(templates.stack_file(lf.lab, config, lf.root, "img:1", ("k", "p"), "k"))
    assert {node["environment"]["TF_USE_LEGACY_KERAS"] for node in stack["services"].values()} == {"1"}
    for manifest in (k8s.tfjob(config, lf.lab, "img:1", TRAIN, "runs"), k8s.jobset(config, lf.lab, "img:1", TRAIN, "runs")):
        assert k8s.problems_of(manifest) == []
        assert json.dumps({"name": "TF_USE_LEGACY_KERAS", "value": "1"}) in json.dumps(manifest)


def test_the_install_says_keras_2_and_explains_a_package_that_wants_another_tensorflow() -> None:
    assert packages.described(cfg.Packages(pip=("pandas",)), 2) == "pandas, tf-keras (Keras 2)"
    # pip's own words (pip 23) for `tf-keras==2.19.0` on a base of TensorFlow 2.21, constrained to it
    output = ("ERROR: Cannot install tf-keras==2.19.0 because these package versions have conflicting dependencies.\n"
              "\nThe conflict is caused by:\n    tf-keras 2.19.0 depends on tensorflow<2.20 and >=2.19\n"
              "    The user requested (constraint) tensorflow==2.21.0\n")
    assert packages.failure_advice(output) == (
        "ERROR: Cannot install tf-keras==2.19.0 because these package versions have conflicting dependencies. "
        "(tf-keras wants tensorflow<2.20 and >=2.19, and the image keeps its base's TensorFlow, one per image: pin that "
        "package to a release for it, or the lab's TensorFlow with --tensorflow)")


def test_a_requirements_file_that_pins_another_tensorflow_is_told_to_pin_the_labs_instead() -> None:
    # pip's own words (pip 23) for `-r requirements.txt` holding tensorflow==2.15.0 on a base of TensorFlow 2.21
    output = ("ERROR: Cannot install tensorflow==2.15.0 because these package versions have conflicting dependencies."
              "\n\nThe conflict is caused by:\n    The user requested tensorflow==2.15.0\n"
              "    The user requested (constraint) tensorflow==2.21.0\n")
    assert packages.failure_advice(output).endswith(
        "(the lab's packages ask for tensorflow==2.15.0, and the image keeps its base's TensorFlow, one per image: pin "
        "the lab's TensorFlow with --tensorflow, or image.tensorflow in tflab.yaml, rather than among its packages)")


# -- one_tensorflow.py, the node's side, on fake installed distributions ------------------------------------------

HELPER = resources.path(resources.NODE_IMAGE) / "one_tensorflow.py"


def installed(site: Path, name: str, version: str) -> None:
    """A distribution as pip sees one installed: its dist-info's METADATA."""
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (folder / "RECORD").write_text("")


@pytest.fixture(params=["this", "3.6"])
def python(request) -> str:
    if request.param == "this":
        return sys.executable
    found = old_python()
    if found is None:
        pytest.fail("no Python 3.6: the node's helper runs on TensorFlow 1.15's images (pyenv install 3.6.15)")
    return str(found)


def helper(python: str, site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(HELPER), *args], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1"})


def pip_list(python: str, site: Path) -> dict[str, str]:
    """What pip sees installed of the fake site's names (pip 18, Python 3.6's, has no `list --path`)."""
    done = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    ours = {path.name.split("-")[0].replace("_", "-").lower() for path in site.iterdir()}
    return {entry["name"].lower(): entry["version"] for entry in json.loads(done.stdout)
            if entry["name"].lower() in ours}


def test_a_base_with_tensorflow_cpu_gets_tensorflow_recorded_and_pinned(python: str, tmp_path: Path) -> None:
    site = tmp_path / "site"
    installed(site, "tensorflow-cpu", "2.21.0")
    installed(site, "keras", "3.15.1")
    done = helper(python, site, str(tmp_path / "constraints.txt"), "--keras", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "tf-keras~=2.21.0\n", "Keras 2 of the base's own TensorFlow"
    assert (tmp_path / "constraints.txt").read_text() == "tensorflow==2.21.0\ntensorflow-cpu==2.21.0\n"
    assert pip_list(python, site) == {"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0", "keras": "3.15.1"}
    metadata = (site / "tensorflow-2.21.0.dist-info" / "METADATA").read_text()
    assert "Requires-Dist: tensorflow-cpu==2.21.0\n" in metadata
    again = helper(python, site, str(tmp_path / "again.txt"))
    assert again.returncode == 0 and again.stdout == "", "no Keras asked: nothing printed"
    assert (tmp_path / "again.txt").read_text() == "tensorflow==2.21.0\ntensorflow-cpu==2.21.0\n", "run twice: the same"


def test_a_base_with_tensorflow_itself_is_only_pinned_and_an_old_one_has_keras_2_already(python: str,
                                                                                       tmp_path: Path) -> None:
    site = tmp_path / "site"
    installed(site, "tensorflow", "2.15.1")
    done = helper(python, site, str(tmp_path / "constraints.txt"), "--keras", "2")
    assert done.returncode == 0 and done.stdout == ""
    assert "TensorFlow 2.15.1's own Keras is Keras 2: nothing to install" in done.stderr
    assert (tmp_path / "constraints.txt").read_text() == "tensorflow==2.15.1\n"
    assert sorted(p.name for p in site.iterdir()) == ["tensorflow-2.15.1.dist-info"]
