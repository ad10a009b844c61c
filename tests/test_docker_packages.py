"""A lab runs the user's own project: its pip and apt packages and its TensorFlow version, on real builds (issue 28)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import cli
from suite_base import closed_port
from test_docker_secrets import PRESENT, saved_images_hold

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]

USES = """import subprocess
import tabulate
import toolz
print("first", toolz.first([7, 8]), "in a table of", len(tabulate.tabulate([[1]]).splitlines()), "lines")
print(subprocess.run(["jq", "-n", "1 + 2"], capture_output=True, text=True, check=True).stdout.strip())
"""


def project(folder: Path, requirements: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "uses.py").write_text(USES)
    (folder / "tflab.yaml").write_text(yaml.safe_dump({"tasks": {"uses": "python /workspace/uses.py"}}))
    if requirements is not None:
        (folder / "requirements.txt").write_text(requirements)
    return folder


def node_image(docker_client, lab: Path) -> str:
    containers = docker_client.containers.list(filters={"label": f"tflab.lab={labfiles.open_lab(lab).project}"})
    tags = {c.image.tags[0] for c in containers if c.image.tags}
    assert len(tags) == 1, tags
    return tags.pop()


def test_pip_and_apt_packages_build_once_run_and_fail_cleanly(labs, runner, docker_client, tmp_path: Path,
                                                              monkeypatch) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    # A credential-bearing pip setting that does not break the install: pip skips a dead link.
    monkeypatch.setenv("PIP_FIND_LINKS", f"http://tflab:{secret}@127.0.0.1:{closed_port()}/wheels")
    monkeypatch.setenv("PIP_RETRIES", "0")
    lab = labs.gen("--pip", "tabulate", "--pip", "toolz", "--apt", "jq", nodes=1, code=project(tmp_path / "code"))
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stdout[-3000:] + up.stderr[-3000:]
    ran = runner.invoke(cli, ["run", "uses", "--lab", str(lab)])
    assert ran.exit_code == 0, ran.stdout[-3000:]
    assert "[worker0] first 7 in a table of" in ran.stdout and "[worker0] 3" in ran.stdout, ran.stdout
    status = runner.invoke(cli, ["status", "--lab", str(lab)])
    assert "packages in the running image: pip: tabulate, toolz; apt: jq" in status.stdout, status.stdout

    # The secrets check over an image with packages: not in history, config or any layer.
    image = node_image(docker_client, lab)
    history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, text=True,
                             check=True).stdout
    assert "tabulate" in history and secret not in history
    inspected = json.dumps(docker_client.api.inspect_image(image))
    where = [key for key, value in docker_client.api.inspect_image(image).items() if secret in json.dumps(value)]
    assert secret not in inspected and "PIP_FIND_LINKS" not in inspected, (image, where)
    assert saved_images_hold([secret.encode(), PRESENT], image) == {PRESENT}, "the secret is in a layer"
    assert docker_client.containers.list(all=True, filters={"label": "tflab.build=packages"}) == []

    # A code change copies, it does not rebuild; an unchanged lab's up is quick.
    (tmp_path / "code" / "uses.py").write_text(USES + "print('changed')\n")
    started = time.monotonic()
    again = runner.invoke(cli, ["up", "--lab", str(lab)])
    took = time.monotonic() - started
    assert again.exit_code == 0 and "installing the lab's packages" not in again.stdout + again.stderr
    assert node_image(docker_client, lab) == image
    print(f"re-up after a code change: {took:.1f}s")

    # A misspelled package: up fails naming it; nothing is tagged or left; the lab's image still works.
    path = lab / "tflab.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["packages"]["pip"] = ["tabulatte-no-such-package"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = {i.id for i in docker_client.images.list()}
    failed = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert failed.exit_code != 0
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("tflab: error: installing the lab's packages failed: ERROR: ") and \
        "tabulatte-no-such-package" in last, failed.stderr[-2000:]
    assert {i.id for i in docker_client.images.list()} <= before, "a failed install tags no image"
    assert docker_client.containers.list(all=True, filters={"label": "tflab.build=packages"}) == []
    assert node_image(docker_client, lab) == image
    still = runner.invoke(cli, ["run", "uses", "--lab", str(lab)])
    assert still.exit_code == 0 and "[worker0] changed" in still.stdout

    # A packages change rebuilds (a specifier no earlier run of this test used: an engine keeps images).
    changed = f"toolz!=0.0.{uuid.uuid4().int % 10**6}"
    doc["packages"]["pip"] = ["tabulate", changed, "six"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    rebuilt = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert rebuilt.exit_code == 0, rebuilt.stderr[-2000:]
    assert f"installing the lab's packages: jq, tabulate, {changed}, six" in rebuilt.stdout + rebuilt.stderr
    assert node_image(docker_client, lab) != image


def test_a_requirements_file_and_a_pinned_tensorflow_side_by_side(labs, runner, docker_client,
                                                                  tmp_path: Path) -> None:
    """The same packages from requirements.txt; and two labs with two TensorFlow versions on one engine."""
    code = project(tmp_path / "code", requirements="tabulate\ntoolz\n")
    pinned = labs.gen("--apt", "jq", "--base", "local", "--tensorflow", "2.19.0", nodes=1, code=code)
    assert yaml.safe_load((pinned / "tflab.yaml").read_text())["packages"]["pip"] == ["-r requirements.txt"]
    plain = labs.gen("--base", "local", nodes=1)
    for lab in (pinned, plain):
        up = runner.invoke(cli, ["up", "--lab", str(lab)])
        assert up.exit_code == 0, up.stdout[-3000:] + up.stderr[-3000:]
    ran = runner.invoke(cli, ["run", "uses", "--lab", str(pinned)])
    assert ran.exit_code == 0 and "[worker0] first 7 in a table of" in ran.stdout, ran.stdout[-3000:]
    versions = {}
    for lab in (pinned, plain):
        done = subprocess.run([sys.executable, "-m", "tflab", "exec", "--lab", str(lab), "worker0", "--", "python", "-c",
                               "import tensorflow as tf; print(tf.__version__)"], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        versions[lab] = done.stdout.strip().splitlines()[-1]
    assert versions[pinned] == "2.19.0"
    assert versions[plain] != "2.19.0", versions
    status = runner.invoke(cli, ["status", "--lab", str(pinned)])
    assert "pip: -r requirements.txt; apt: jq; TensorFlow 2.19.0 (pinned)" in status.stdout, status.stdout
