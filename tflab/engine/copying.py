"""Code and data into the nodes: only what changed since each node's last copy, one tar stream per node."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import docker

from tflab.engine.builds import Progress
from tflab.engine.containers import copy_into
from tflab.errors import UserError
from tflab.host import filetree
from tflab.host.labfiles import LabFiles

STATE_FILE = ".tflab-state.json"  # in the lab: what each node (by container id) holds


@dataclass(frozen=True)
class Sync:
    """A host folder and where it lands in every node."""

    kind: str  # code | data
    source: Path
    target: str


@dataclass(frozen=True)
class CopyTarget:
    """Where files go for one node: the id its copy is remembered by, and how to put an archive there."""

    ident: str
    put: Callable[[Path, tuple[str, ...]], None]  # (archive unpacked at /, absolute paths to remove)


def docker_target(client: docker.DockerClient, container) -> CopyTarget:
    """A container of this host's engine as a copy target."""
    return CopyTarget(container.id, partial(copy_into, client, container))


def syncs(lf: LabFiles) -> list[Sync]:
    """What `up` copies: the code always, the data unless it is mounted."""
    out = []
    if lf.config.code:
        out.append(Sync("code", lf.resolve(lf.config.code), "/workspace"))
    if lf.config.data and lf.config.data_mode == "copy":
        out.append(Sync("data", lf.resolve(lf.config.data), "/data"))
    for sync in out:
        if not sync.source.is_dir():
            raise UserError(f"the lab's {sync.kind} folder {sync.source} does not exist")
    return out


class Copier:
    """One `up`'s copies: each node gets the files it lacks, as soon as it runs, from archives made once.

    Each node's copy is remembered by file (size and mtime); only new and changed files
    travel, code and data in one tar stream; files gone from the host are removed; nothing
    is cleared first.
    """

    def __init__(self, lf: LabFiles, progress: Progress) -> None:
        self.lf = lf
        self.progress = progress
        self.state = self._load()
        self.manifests = {sync: filetree.manifest(sync.source, exclude=lf.root) for sync in syncs(lf)}
        self.archives: dict[tuple[tuple[str, ...], tuple[str, ...]], Path] = {}
        self.copied: dict[str, list[str]] = {}
        self.idents: set[str] = set()
        self.lock = threading.Lock()
        self.announced = False

    def _load(self) -> dict:
        try:
            state = json.loads((self.lf.root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def copy(self, name: str, target: CopyTarget) -> None:
        """Bring one node's code and data up to date."""
        arcnames: list[str] = []
        removed: list[str] = []
        kinds: list[str] = []
        sources: dict[str, Path] = {}
        with self.lock:
            self.idents.add(target.ident)
            held = self.state.get(target.ident, {})
        for sync, manifest in self.manifests.items():
            old = held.get(sync.kind)
            old = old if isinstance(old, dict) else {}
            if old == manifest:
                continue
            folder = sync.target.strip("/")
            for path, stamp in manifest.items():
                if old.get(path) != stamp:
                    arcnames.append(f"{folder}/{path}")
                    sources[f"{folder}/{path}"] = sync.source / path
            removed += [f"{sync.target}/{p}" for p in old if p not in manifest]
            kinds.append(sync.kind)
        if not kinds:
            return
        key = (tuple(arcnames), tuple(removed))
        with self.lock:
            if not self.announced:
                self.announced = True
                self.progress.step(f"copying {' and '.join(kinds)} into the nodes")
            archive = self.archives.get(key)
            if archive is None:
                archive = self.archives[key] = filetree.pack([(sources[a], a) for a in arcnames])
        target.put(archive, key[1])
        with self.lock:
            for sync, manifest in self.manifests.items():
                if sync.kind in kinds:
                    self.state.setdefault(target.ident, {})[sync.kind] = manifest
            self.copied[name] = kinds

    def finish(self) -> list[str]:
        """Remember what every node holds now; what was copied, as `kind→node`."""
        for archive in self.archives.values():
            archive.unlink(missing_ok=True)
        kept = {ident: v for ident, v in self.state.items() if ident in self.idents}
        (self.lf.root / STATE_FILE).write_text(json.dumps(kept))
        order = [sync.kind for sync in self.manifests]
        return [f"{kind}→{name}" for kind in order for name, kinds in self.copied.items() if kind in kinds]

