"""tflab as users get it: a wheel in a fresh venv outside the checkout, the four commands verbatim."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from conftest import REPO

from tflab.engine import compose_lab as lab_ops
from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A venv (outside the checkout) with tflab installed from a wheel built from this tree."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(dist.glob("tflab-*.whl"))
    target = root / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    installed = subprocess.run([str(target / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True,
                               text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return target


def test_the_wheel_carries_every_file_tflab_needs(wheel_venv: Path) -> None:
    import zipfile

    wheel = next((wheel_venv.parent / "dist").glob("tflab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("tflab/templates/docker-compose.yml.j2", "tflab/templates/Dockerfile.j2",
                   "tflab/templates/docker-stack.yml.j2", "tflab/images/node/tflab_guard/supervise.py",
                   "tflab/images/node/entrypoint.sh", "tflab/examples/mnist_async.py", "tflab/examples/tflab.yaml",
                   "tflab/examples/data/digits.npz", "tflab/schemas/tfjob-kubeflow.org-v1.schema.json",
                   "tflab/cli/app.py"):
        assert needed in names, needed
    shipped = [p for folder in ("tflab", "images/node", "templates") for p in (REPO / folder).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")]
    in_wheel = {"tflab/" + str(p.relative_to(REPO)) if not p.is_relative_to(REPO / "tflab") else
                str(p.relative_to(REPO)) for p in shipped}
    assert sorted(in_wheel - names) == []  # every module, guard part, node script (fault.sh) and template
    assert not [n for n in names if "__pycache__" in n]


def test_the_four_commands_verbatim_from_an_empty_folder(wheel_venv: Path, docker_client, base_image,
                                                         tmp_path: Path) -> None:
    folder = tmp_path / "mylab"
    folder.mkdir()
    tflab = str(wheel_venv / "bin" / "tflab")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{wheel_venv / 'bin'}{os.pathsep}{env['PATH']}"

    def tflab_says(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return subprocess.run([tflab, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import tflab; print(tflab.__file__)"],
                           cwd=folder, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(wheel_venv)), where  # the wheel's tflab, not this checkout's
    project = None
    try:
        gen = tflab_says("gen", "--nodes", "4", "--gpus-per-node", "0")
        assert gen.returncode == 0, gen.stderr
        project = labfiles.open_lab(folder).project
        up = tflab_says("up")
        assert up.returncode == 0, up.stderr[-3000:]
        trained = tflab_says("exec", "worker0", "train")
        assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
        accuracy = [line for line in trained.stdout.splitlines() if "test accuracy" in line]
        assert accuracy and float(accuracy[-1].split()[-1]) >= 0.9, trained.stdout[-2000:]
        assert "tflab: ps0 is serving on ps0:2222 (started for this exec)" in trained.stderr
        assert "tflab: stopped ps0" in trained.stderr
        assert "absl::InitializeLog" not in trained.stderr and "oneDNN" not in trained.stderr
        down = tflab_says("down")
        assert down.returncode == 0, down.stderr
        label = {"label": f"tflab.lab={project}"}
        assert docker_client.containers.list(all=True, filters=label) == []
        assert docker_client.networks.list(filters=label) == []
    finally:
        if project is not None:
            lab_ops.down(project, docker_client)
    shutil.rmtree(folder / "runs", ignore_errors=True)
