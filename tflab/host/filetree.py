"""Folders of this host as copies see them: what they hold (paths, sizes, times), and tars of files."""

from __future__ import annotations

import os
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tflab.errors import UserError

SKIP_NAMES = {"__pycache__", ".git", ".pytest_cache", ".ipynb_checkpoints"}


def _walk(folder: Path, exclude: Path | None) -> Iterable[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs
            if d not in SKIP_NAMES and (exclude is None or Path(root, d).resolve() != exclude)
        )
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(root, name)


def manifest(folder: Path, exclude: Path | None = None) -> dict[str, list[int]]:
    """What `up` compares to decide what to copy: every file's relative path, size and mtime."""
    out: dict[str, list[int]] = {}
    for path in _walk(folder, exclude):
        try:
            stat = path.stat()
        except OSError:
            continue  # a dangling link or a file gone meanwhile: nothing to copy
        out[str(path.relative_to(folder))] = [stat.st_size, stat.st_mtime_ns]
    return out


def pack(entries: list[tuple[Path, str]]) -> Path:
    """Files as a tar on disk, each under its name in the archive (streamed to every node from there)."""
    handle = tempfile.NamedTemporaryFile(prefix="tflab-copy-", suffix=".tar", delete=False)
    try:
        # Links are followed: a node cannot see what a link on the host points to.
        with tarfile.open(fileobj=handle, mode="w", dereference=True) as tar:
            for path, name in entries:
                try:
                    tar.add(path, arcname=name, recursive=False)
                except OSError as exc:
                    raise UserError(f"cannot read {path} to copy it into the nodes: {exc.strerror or exc}") from exc
    finally:
        handle.close()
    return Path(handle.name)
