"""The local base's recipe, without an engine: which bootstrap tool, whether host wheels fit, pip's script."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tflab import base_image
from tflab.errors import UserError
from tflab.hostsettings import AptMirror

BOOKWORM = AptMirror("http://deb.debian.org/debian", "bookworm")
OURS = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def test_mmdebstrap_is_preferred_and_debootstrap_will_do() -> None:
    assert base_image.bootstrap_tool(lambda tool: f"/usr/bin/{tool}") == "mmdebstrap"
    assert base_image.bootstrap_tool(lambda tool: "/usr/sbin/debootstrap" if tool == "debootstrap" else None) \
        == "debootstrap"
    with pytest.raises(UserError, match="neither mmdebstrap nor debootstrap is installed; run `apt-get install"):
        base_image.bootstrap_tool(lambda _tool: None)


@pytest.mark.parametrize(("os_release", "python", "fits"), [
    ('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n', OURS, True),
    ('VERSION_CODENAME="bookworm"\n', OURS, True),
    ("VERSION_CODENAME=trixie\n", OURS, False),  # another release: another Python, perhaps
    ("VERSION_CODENAME=bookworm\n", "python3.2", False),  # the release's Python is not ours
    ("ID=alpine\n", OURS, False),
])
def test_host_wheels_are_fetched_only_for_the_bases_own_python(tmp_path: Path, os_release: str, python: str,
                                                               fits: bool) -> None:
    (tmp_path / python).touch()
    (tmp_path / "python3").symlink_to(tmp_path / python)
    assert base_image.target_python_is_ours(BOOKWORM, os_release, tmp_path / "python3") is fits


def test_the_install_tries_the_fetched_wheels_then_the_index() -> None:
    plain = base_image.install_script("tensorflow-cpu")
    assert "--no-index" not in plain and "'tensorflow-cpu' tensorboard" in plain
    with_wheels = base_image.install_script("tensorflow-cpu", wheels=True)
    assert (f"pip install --no-cache-dir --progress-bar off --disable-pip-version-check --no-index --find-links "
            f"{base_image.WHEELS_MOUNT} 'tensorflow-cpu' tensorboard || /opt/tensorflow/bin/pip install") in with_wheels
    # Settings come from the mounted files only: nothing of them on the command line.
    assert with_wheels.startswith(f"set -e; set -a; . {base_image.BUILD_MOUNT}/proxy.env; set +a;")


def test_a_prefetch_gives_its_wheels_only_when_it_succeeded_and_stops_with_the_build(tmp_path: Path) -> None:
    import subprocess

    log = tmp_path / "base.log"
    done = base_image.WheelPrefetch(tmp_path, subprocess.Popen(["sh", "-c", "exit 0"]), tmp_path / "w.log")
    (tmp_path / "w.log").write_text("Saved ./tensorflow_cpu.whl\n")
    assert done.finish(log) == tmp_path
    assert "wheels fetched on the host beside the bootstrap (exit 0)" in log.read_text()
    assert "Saved ./tensorflow_cpu.whl" in log.read_text()
    failed = base_image.WheelPrefetch(tmp_path, subprocess.Popen(["sh", "-c", "exit 1"]), tmp_path / "w.log")
    assert failed.finish(log) is None  # the base's pip then fetches from the index
    hanging = base_image.WheelPrefetch(tmp_path, subprocess.Popen(["sleep", "60"]), tmp_path / "w.log")
    hanging.cancel()
    assert hanging.child.returncode is not None
