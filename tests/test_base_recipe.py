"""The local base's recipe, without an engine: which bootstrap tool, whether host wheels fit, pip's script."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker.errors
import pytest

from tflab.engine import local_base
from tflab.errors import EngineError, UserError
from tflab.host.buildsettings import AptMirror

BOOKWORM = AptMirror("http://deb.debian.org/debian", "bookworm")
OURS = f"python{sys.version_info[0]}.{sys.version_info[1]}"


def test_mmdebstrap_is_preferred_and_debootstrap_will_do() -> None:
    assert local_base.bootstrap_tool(lambda tool: f"/usr/bin/{tool}") == "mmdebstrap"
    assert local_base.bootstrap_tool(lambda tool: "/usr/sbin/debootstrap" if tool == "debootstrap" else None) \
        == "debootstrap"
    with pytest.raises(UserError, match="neither mmdebstrap nor debootstrap is installed; run `apt-get install"):
        local_base.bootstrap_tool(lambda _tool: None)


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
    assert local_base.target_python_is_ours(BOOKWORM, os_release, tmp_path / "python3") is fits


def run_install(tmp_path: Path, package: str, wheels: bool) -> list[list[str]]:
    """The build's command run here, with a `python3` that makes a venv whose pip notes its arguments."""
    bin_dir, mount, venv = tmp_path / "bin", tmp_path / "mount", tmp_path / "venv"
    for folder in (bin_dir, mount):
        folder.mkdir(parents=True, exist_ok=True)
    (mount / "proxy.env").write_text("HTTPS_PROXY=http://proxy.example:3128\n")
    calls = tmp_path / "pip-calls"
    fake_python = bin_dir / "python3"
    fake_python.write_text(
        "#!/bin/sh\n"  # `python3 -m venv DIR`: a venv whose pip records its argv, one argument a line
        'mkdir -p "$3/bin"\n'
        f'printf \'#!/bin/sh\\nfor a in "$@"; do echo "$a"; done >> {calls}\\necho -- >> {calls}\\n'
        '[ -n "$FAIL_NO_INDEX" ] && case "$*" in *--no-index*) exit 1;; esac\\nexit 0\\n\' > "$3/bin/pip"\n'
        'printf \'#!/bin/sh\\nexit 0\\n\' > "$3/bin/python"\n'
        'chmod +x "$3/bin/pip" "$3/bin/python"\n')
    fake_python.chmod(0o755)
    argv = local_base.install_argv(package, wheels=wheels)
    argv[argv.index(local_base.BUILD_MOUNT)] = str(mount)
    argv[argv.index(local_base.VENV)] = str(venv)
    done = subprocess.run(argv, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAIL_NO_INDEX": "1" if wheels else ""},
                          capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    groups = calls.read_text().split("--\n")
    return [group.splitlines() for group in groups if group]


def test_the_install_tries_the_fetched_wheels_then_the_index(tmp_path: Path) -> None:
    plain = run_install(tmp_path / "a", "tensorflow-cpu", wheels=False)
    assert plain == [["install", "--no-cache-dir", "--progress-bar", "off", "--disable-pip-version-check",
                      "tensorflow-cpu", "tensorboard"]]
    with_wheels = run_install(tmp_path / "b", "tensorflow-cpu", wheels=True)
    assert [call[4:] for call in with_wheels] == [
        ["--disable-pip-version-check", "--no-index", "--find-links", local_base.WHEELS_MOUNT, "tensorflow-cpu",
         "tensorboard"],
        ["--disable-pip-version-check", "tensorflow-cpu", "tensorboard"]]


def test_a_requirement_reaches_pip_as_one_argument_whatever_it_holds(tmp_path: Path) -> None:
    odd = "tensorflow-cpu>=2.16 ; python_version >= '3.9' $(touch pwned) `touch pwned2`"
    assert run_install(tmp_path, odd, wheels=False)[0][-2:] == [odd, "tensorboard"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()
    argv = local_base.install_argv(odd)
    assert odd not in argv[2], "no value is ever part of the script's text"


def test_a_prefetch_gives_its_wheels_only_when_it_succeeded_and_stops_with_the_build(tmp_path: Path) -> None:
    import subprocess

    log = tmp_path / "base.log"
    done = local_base.WheelPrefetch(tmp_path, subprocess.Popen(["sh", "-c", "exit 0"]), tmp_path / "w.log")
    (tmp_path / "w.log").write_text("Saved ./tensorflow_cpu.whl\n")
    assert done.finish(log) == tmp_path
    assert "wheels fetched on the host beside the bootstrap (exit 0)" in log.read_text()
    assert "Saved ./tensorflow_cpu.whl" in log.read_text()
    failed = local_base.WheelPrefetch(tmp_path, subprocess.Popen(["sh", "-c", "exit 1"]), tmp_path / "w.log")
    assert failed.finish(log) is None  # the base's pip then fetches from the index
    hanging = local_base.WheelPrefetch(tmp_path, subprocess.Popen(["sleep", "60"]), tmp_path / "w.log")
    started = time.monotonic()
    hanging.cancel()
    assert hanging.child.returncode == -signal.SIGKILL, "killed, not waited out"
    assert time.monotonic() - started < 5


class RefusingEngine:
    """An engine whose import reads a little of the tree, then fails (as a full disk would)."""

    class api:  # noqa: N801 - the SDK's shape
        @staticmethod
        def import_image(src, repository, tag, changes):
            src.read(1024)
            raise docker.errors.APIError("500 Server Error", explanation="no space left on device")


def tar_children() -> list[str]:
    """tar processes of this test's, still alive."""
    mine = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == mine and fields[0] != "Z" and "tar" in (stat.parent / "comm").read_text():
                found.append(stat.parent.name)
        except OSError:
            continue
    return found


def test_a_failed_import_of_the_base_ends_at_once_and_leaves_no_tar(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    tree.mkdir()
    (tree / "big").write_bytes(os.urandom(4 * 2**20))  # more than a pipe holds: tar blocks until read
    started = time.monotonic()
    with pytest.raises(EngineError, match="would not import tflab-base:cpu: no space left on device"):
        local_base._import(RefusingEngine(), tree, "tflab-base:cpu", [])
    assert time.monotonic() - started < 10
    assert tar_children() == []


class BrokenExport:
    """A raw base whose export stops half way."""

    class containers:  # noqa: N801 - the SDK's shape
        @staticmethod
        def create(*_args, **_kw):
            return BrokenExport.Container()

    class Container:
        removed = False

        def export(self):
            yield b"\0" * 1024
            raise docker.errors.APIError("500 Server Error", explanation="export interrupted")

        def remove(self, force: bool = False) -> None:
            BrokenExport.Container.removed = True


def test_a_failed_export_of_the_raw_base_leaves_no_tar_and_no_container(tmp_path: Path) -> None:
    with pytest.raises(docker.errors.APIError):
        local_base._export(BrokenExport(), "tflab-base-raw:x", tmp_path / "rootfs")
    assert tar_children() == []
    assert BrokenExport.Container.removed
