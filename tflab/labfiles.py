"""The lab folder: written whole by `gen` (or not at all), read by every other command."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tflab import config as cfg
from tflab import render
from tflab.config import LabConfig
from tflab.errors import UserError
from tflab.model import Lab, plan

STATE_DIR = ".tflab"
PRIVATE_KEY = "id_ed25519"
PUBLIC_KEY = "id_ed25519.pub"  # tflab's own bookkeeping in a lab: copy stamps, locks, detached runs


@dataclass(frozen=True)
class LabFiles:
    """A lab folder with its config and plan."""

    root: Path
    config: LabConfig
    lab: Lab

    @property
    def project(self) -> str:
        """The compose project (or stack) name, and the `tflab.lab` label of everything it makes."""
        return render.project_name(self.config.name, self.root)

    @property
    def compose_path(self) -> Path:
        """The compose file."""
        return self.root / cfg.COMPOSE_FILE

    @property
    def stack_path(self) -> Path:
        """The stack file of a swarm lab."""
        return self.root / cfg.STACK_FILE

    @property
    def image_dir(self) -> Path:
        """The node image's build context."""
        return self.root / cfg.IMAGE_DIR

    @property
    def keys_dir(self) -> Path:
        """The lab key pair's folder."""
        return self.root / cfg.KEYS_DIR

    @property
    def private_key(self) -> Path:
        """The lab's private key (mode 0600)."""
        return self.keys_dir / PRIVATE_KEY

    @property
    def runs_dir(self) -> Path:
        """The host folder every node sees at /runs."""
        return self.resolve(self.config.runs)

    @property
    def state_dir(self) -> Path:
        """tflab's bookkeeping in the lab (made on first use)."""
        folder = self.root / STATE_DIR
        folder.mkdir(exist_ok=True)
        return folder

    def resolve(self, path: str) -> Path:
        """A path of tflab.yaml, relative to the lab folder."""
        return (self.root / path).resolve()

    def image_context(self) -> dict[str, bytes]:
        """The build context as the lab holds it now (the user may have edited it)."""
        if not self.image_dir.is_dir():
            raise UserError(f"{self.image_dir} is missing; run `tflab gen --force` to write it again")
        return {p.name: p.read_bytes() for p in sorted(self.image_dir.iterdir()) if p.is_file()}

    def image_tag(self, base_id: str = "") -> str:
        """The node image's tag, a hash of its build context and its base image's id."""
        return render.image_tag(self.image_context(), base_id)

    def write_compose(self, image: str) -> bool:
        """Write the compose file again from tflab.yaml, naming `image`; True when it changed."""
        text = render.compose_file(self.lab, self.config, self.root, image)
        if self.compose_path.is_file() and self.compose_path.read_text() == text:
            return False
        self.compose_path.write_text(text)
        return True


def open_lab(root: Path) -> LabFiles:
    """The lab in `root` (its tflab.yaml read and planned)."""
    root = root.resolve()
    config = cfg.load(root)
    try:
        lab = plan(config.topology, config.gpus)
    except UserError as exc:
        raise UserError(f"{root / cfg.LAB_FILE}: {exc}") from None
    return LabFiles(root=root, config=config, lab=lab)


def check_paths(config: LabConfig, root: Path, scaffold: dict[str, dict[str, bytes]]) -> None:
    """Code and data folders exist (or are about to be written) and hold none of the lab's own files."""
    for flag, path in (("--code", config.code), ("--data", config.data)):
        if path is None or path in scaffold:
            continue
        folder = (root / path).resolve()
        if not folder.is_dir():
            raise UserError(f"{flag} {path}: no such folder (relative paths are from the lab folder {root})")
        if folder == root:
            raise UserError(f"{flag} {path} is the lab folder itself; point it at a folder of its own")


def write_lab(config: LabConfig, root: Path, force: bool,
              scaffold: dict[str, dict[str, bytes]] | None = None) -> LabFiles:
    """Write a whole lab into `root`: everything is rendered before the first file is written.

    `scaffold` holds folders to create in the lab (the bundled examples as `code`, their
    data as `data`), by folder and relative path; a folder that exists already is the
    user's and is left as it is.
    """
    root = root.resolve()
    scaffold = scaffold or {}
    if (root / cfg.LAB_FILE).exists() and not force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    check_paths(config, root, scaffold)
    lab = plan(config.topology, config.gpus)
    lab_yaml = cfg.to_yaml(config)
    context = render.image_context(config)
    compose = render.compose_file(lab, config, root, render.image_tag(context))
    from tflab import keys  # cryptography: only gen needs it

    pair = keys.new_key_pair(f"tflab-{config.name}")

    root.mkdir(parents=True, exist_ok=True)
    for folder, files in scaffold.items():
        target = root / folder
        if target.exists():
            continue
        for relative, content in files.items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    image_dir = root / cfg.IMAGE_DIR
    if image_dir.exists():
        shutil.rmtree(image_dir)
    image_dir.mkdir()
    for name, content in context.items():
        (image_dir / name).write_bytes(content)
        if name.endswith((".sh", ".py")):
            os.chmod(image_dir / name, 0o755)
    keys_dir = root / cfg.KEYS_DIR
    keys_dir.mkdir(exist_ok=True)
    private = keys_dir / PRIVATE_KEY
    private.unlink(missing_ok=True)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(pair.private)
    (keys_dir / PUBLIC_KEY).write_text(pair.public)
    (root / cfg.COMPOSE_FILE).write_text(compose)
    # tflab.yaml last: a lab folder without it is not a lab, so an interrupted gen is no lab.
    (root / cfg.LAB_FILE).write_text(lab_yaml)
    return LabFiles(root=root, config=config, lab=lab)
