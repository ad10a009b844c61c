"""The labs generated on this host and the ports each publishes, so that the next lab takes other ones.

A port is free on the host only while no lab that publishes it is up: two labs generated one after
the other, before either is up, would both take 20022. So `gen` keeps, per user, where each lab is
and which host ports it publishes (`$XDG_CACHE_HOME/tflab/labs.json`); a lab generated next passes
them by as it passes by a port in use. A lab whose folder no longer holds that lab (removed, or made
again with other ports) no longer claims them. One `gen` at a time reads and writes it (a lock).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tflab.errors import UserError
from tflab.host.locks import file_lock
from tflab.plan import config as cfg
from tflab.plan.labfile import from_yaml
from tflab.plan.topology import roles


def index_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tflab" / "labs.json"


@contextmanager
def locked() -> Iterator[None]:
    """While inside, no other `gen` of this user reads or writes the index (where the cache folder cannot be
    written, gen goes on without it: the ports in use on the host still count)."""
    held = ExitStack()
    try:
        held.enter_context(file_lock(index_path().with_suffix(".lock")))
    except OSError:
        pass
    with held:
        yield


def _read() -> dict[str, list[int]]:
    try:
        doc = json.loads(index_path().read_text())
    except (OSError, ValueError):
        return {}
    labs = doc.get("labs") if isinstance(doc, dict) else None
    if not isinstance(labs, dict):
        return {}
    return {root: ports for root, ports in labs.items()
            if isinstance(ports, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in ports)}


def published(root: Path) -> list[int] | None:
    """The host ports the lab in `root` publishes as its tflab.yaml says now (None: no readable compose lab there)."""
    try:
        config = from_yaml((root / cfg.LAB_FILE).read_text(), str(root / cfg.LAB_FILE))
    except (OSError, UnicodeDecodeError, UserError):  # whatever is there, it claims nothing
        return None
    if config.target != "compose":
        return None
    count = len(roles(config.topology))
    ssh, board = config.topology.ssh_port_base, config.topology.tensorboard_port_base
    return [*range(ssh, ssh + count), *range(board, board + count)]


def claimed(besides: Path) -> set[int]:
    """The ports the other labs in the index still publish (`besides`: the folder being generated)."""
    ports: set[int] = set()
    for root, recorded in _read().items():
        if Path(root) == besides.resolve():
            continue
        if published(Path(root)) == recorded:
            ports.update(recorded)
    return ports


def roots() -> list[Path]:
    """The folders of the labs generated here that still hold a lab, in the order they were recorded."""
    return [Path(root) for root in _read() if (Path(root) / cfg.LAB_FILE).is_file()]


def record(root: Path) -> None:
    """Keep the lab in `root` in the index with the ports it publishes; forget labs that are gone."""
    labs = {folder: ports for folder, ports in _read().items() if published(Path(folder)) == ports}
    ports = published(root)
    if ports is not None:
        labs[str(root.resolve())] = ports
    path = index_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"labs": labs}, indent=1) + "\n")
        temporary.replace(path)
    except OSError:
        pass  # a cache folder that cannot be written: the next gen knows the ports in use only
