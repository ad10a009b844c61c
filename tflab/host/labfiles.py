"""The lab folder: written whole by `gen` (or not at all), read by every other command."""

from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tflab.errors import UserError
from tflab.host import dockerconfig
from tflab.plan import config as cfg
from tflab.plan import labfile
from tflab.plan import shares
from tflab.plan.config import LAB_FILE, LabConfig, Task
from tflab.plan.labfile import from_yaml, to_yaml
from tflab.plan.taskfile import tasks_from_text
from tflab.plan.topology import Lab, plan
from tflab.render import image_files, templates

STATE_DIR = ".tflab"  # tflab's own bookkeeping in a lab: locks, detached runs' logs


@dataclass(frozen=True)
class LabFiles:
    """A lab folder with its config and plan."""

    root: Path
    config: LabConfig
    lab: Lab

    @functools.cached_property
    def project(self) -> str:
        """The compose project (or stack) name, and the `tflab.lab` label of everything it makes.

        Named once, for the folder `gen` wrote, and kept in the lab (`.tflab/identity.json`): a lab
        moved elsewhere (`mv lab lab2`) still finds its containers; a copy beside its original
        (which still holds the lab) is a lab of its own.
        """
        return project_of(self.root, self.config.name)

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
        return self.keys_dir / cfg.PRIVATE_KEY

    @property
    def runs_dir(self) -> Path:
        """The host folder every node sees at /runs."""
        return self.resolve(self.config.runs)

    @property
    def state_dir(self) -> Path:
        """tflab's bookkeeping in the lab: copy stamps, locks, detached runs' logs (made by `state_file`)."""
        return self.root / STATE_DIR

    def state_file(self, name: str) -> Path:
        """A file of tflab's bookkeeping in the lab, its folder made."""
        self.state_dir.mkdir(exist_ok=True)
        return self.state_dir / name

    @functools.cached_property
    def retired_note(self) -> str | None:
        """One line where tflab.yaml still names settings an earlier tflab had and this one ignores, else None."""
        path = self.root / LAB_FILE
        try:
            found = labfile.retired_keys(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        if not found:
            return None
        one = len(found) == 1
        return labfile.RETIRED_NOTE.format(keys=", ".join(f"`{key}`" for key in found), source=path,
                                           does="does" if one else "do", them="it" if one else "them")

    def resolve(self, path: str) -> Path:
        """A path of tflab.yaml, relative to the lab folder."""
        return (self.root / path).resolve()

    def image_context(self) -> dict[str, bytes]:
        """The build context as the lab holds it now (the user may have edited it), with this tflab's guard.

        The guard is tflab's side of the node, not the lab's: it must speak what this tflab
        speaks, so the context carries the current one whatever image/ holds (`refresh_guard`
        writes it there). Reads only.
        """
        if not self.image_dir.is_dir():
            raise UserError(f"{self.image_dir} is missing; run `tflab gen --force` to write it again")
        context = {p.name: p.read_bytes() for p in sorted(self.image_dir.iterdir())
                   if p.is_file() and p.name != image_files.PACKAGES_FILE}
        context[image_files.GUARD_FILE] = image_files.guard_zipapp()
        spy = image_files.py_spy_binary()  # tflab's too: not written into the lab's folder
        if spy is not None:
            context[image_files.PY_SPY] = spy.read_bytes()
        # the packages as tflab.yaml says them now, the requirements files as the code folder holds them now
        return {**context, **image_files.packages_files(self.config, self.requirements())}

    def refresh_guard(self) -> bool:
        """Write this tflab's guard into image/ where a lab made by another tflab holds another one; whether it did."""
        guard = image_files.guard_zipapp()
        path = self.image_dir / image_files.GUARD_FILE
        if path.is_file() and path.read_bytes() == guard:
            return False
        path.write_bytes(guard)
        path.chmod(0o755)
        return True

    def requirements(self) -> dict[str, bytes]:
        """The code folder's requirements files the lab's `pip: [-r FILE]` names, by name."""
        found = {}
        for name in self.config.packages.requirements_files:
            path = self.resolve(self.config.code or cfg.CODE_DIR) / name
            try:
                found[name] = path.read_bytes()
            except OSError as exc:
                raise UserError(f"packages.pip names -r {name}, but {path} cannot be read ({exc.strerror}); "
                                "put it in the code folder, or take it out of tflab.yaml") from None
        return found

    def image_tag(self, base_id: str = "") -> str:
        """The node image's tag, a hash of its build context and its base image's id."""
        return image_files.image_tag(self.image_context(), base_id)

    def write_compose(self, image: str) -> bool:
        """Write the compose file again from tflab.yaml, naming `image`; True when it changed."""
        text = templates.compose_file(self.lab, self.config, self.root, image, self.project,
                                      dockerconfig.container_proxies())
        if self.compose_path.is_file() and self.compose_path.read_text() == text:
            return False
        self.compose_path.write_text(text)
        return True


def open_lab(root: Path) -> LabFiles:
    """The lab in `root` (its tflab.yaml read and planned)."""
    root = root.resolve()
    config = load(root)
    try:
        check_folders(config, root)
    except UserError as exc:
        raise UserError(f"{root / cfg.LAB_FILE}: {exc}") from None
    try:
        lab = plan(config.topology, config.gpus, config.host)
    except UserError as exc:
        raise UserError(f"{root / cfg.LAB_FILE}: {exc}") from None
    return LabFiles(root=root, config=config, lab=lab)


# Folders no lab means: they would be copied into every node whole, or mounted into them writable.
SYSTEM_FOLDERS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root",
                  "/run", "/sbin", "/srv", "/sys", "/usr", "/var", "/home", "/tmp", "/mnt", "/media")
INSIDE_SYSTEM = ("/bin", "/boot", "/dev", "/etc", "/lib", "/proc", "/sbin", "/sys", "/usr")


def folder_problem(folder: Path) -> str | None:
    """Why a folder cannot be a lab's code, data or runs (the file system's root, a system folder, a home), or None."""
    text = str(folder)
    if text in SYSTEM_FOLDERS or any(text.startswith(top + "/") for top in INSIDE_SYSTEM):
        return "is a system folder"
    if folder == Path.home() or folder.parent == Path("/home"):
        return "is a whole home folder"
    return None


def check_folders(config: LabConfig, root: Path) -> None:
    """The lab's code, data and runs folders are folders a lab can mean (wherever tflab.yaml points them)."""
    for key, path in (("code", config.code), ("data", config.data), ("runs", config.runs)):
        if path is None:
            continue
        folder = (root / path).resolve()
        problem = folder_problem(folder)
        if problem is not None:
            raise UserError(f"{key} {path} ({folder}) {problem}: every node would get it whole; "
                            f"point {key} at a folder of the project's own")


IDENTITY = "identity.json"


def project_of(root: Path, name: str) -> str:
    """The lab's project: the one named at gen where the lab was moved since, else the one of this folder."""
    here = templates.project_name(name, root)
    try:
        identity = json.loads((root / STATE_DIR / IDENTITY).read_text())
        project, made_in = str(identity["project"]), Path(str(identity["root"]))
    except (OSError, ValueError, KeyError, TypeError):
        return here
    if made_in == root:
        return project
    if not (made_in / cfg.LAB_FILE).exists():  # moved here: the lab is here now (a copy of it is another lab)
        try:
            write_identity(root, project)
        except OSError:
            pass
        return project
    return here  # a copy: the original is still there, with its own containers


def recorded_project(root: Path) -> str | None:
    """The project `gen` recorded for the lab in `root` (.tflab/identity.json), whatever its tflab.yaml holds now."""
    try:
        return str(json.loads((root / STATE_DIR / IDENTITY).read_text())["project"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_identity(root: Path, project: str) -> None:
    """Keep the lab's project in the lab, for wherever the folder goes."""
    (root / STATE_DIR).mkdir(exist_ok=True)
    (root / STATE_DIR / IDENTITY).write_text(json.dumps({"project": project, "root": str(root)}) + "\n")


def check_paths(config: LabConfig, root: Path, scaffold: dict[str, dict[str, bytes]]) -> None:
    """Code and data folders exist (or are about to be written) and hold none of the lab's own files."""
    check_folders(config, root)
    for flag, path in (("--code", config.code), ("--data", config.data)):
        if path is None or path in scaffold:
            continue
        folder = (root / path).resolve()
        if not folder.is_dir():
            raise UserError(f"{flag} {path}: no such folder (relative paths are from the lab folder {root})")
        if folder == root:
            raise UserError(f"{flag} {path} is the lab folder itself; point it at a folder of its own")


def write_lab(config: LabConfig, root: Path, force: bool,
              scaffold: dict[str, dict[str, bytes]] | None = None, planned: Lab | None = None) -> LabFiles:
    """Write a whole lab into `root`: everything is rendered before the first file is written.

    `scaffold` holds folders to create in the lab (the bundled examples as `code`, their
    data as `data`), by folder and relative path; a folder that exists already is the
    user's and is left as it is. `planned` is the lab as `config` plans it, where the caller has it.
    """
    root = root.resolve()
    scaffold = scaffold or {}
    if (root / cfg.LAB_FILE).exists() and not force:
        raise UserError(f"a lab already exists in {root}; pass --force to overwrite it")
    check_paths(config, root, scaffold)
    lab = planned or plan(config.topology, config.gpus, config.host)
    lab_yaml = to_yaml(config)
    context = image_files.image_context(config)
    project = project_of(root, config.name)  # an existing lab's (gen --force) stays its own
    compose = templates.compose_file(lab, config, root, image_files.image_tag(context), project,
                                     dockerconfig.container_proxies())
    from tflab.host import keys  # cryptography: only gen needs it

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
        if name.endswith((".sh", ".py", ".pyz")):
            os.chmod(image_dir / name, 0o755)
    keys_dir = root / cfg.KEYS_DIR
    keys_dir.mkdir(exist_ok=True)
    private = keys_dir / cfg.PRIVATE_KEY
    private.unlink(missing_ok=True)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(pair.private)
    (keys_dir / cfg.PUBLIC_KEY).write_text(pair.public)
    (root / cfg.COMPOSE_FILE).write_text(compose)
    # what tflab.yaml's first line names: an editor completes and checks the file as the user types
    (root / labfile.SCHEMA_FILE).write_text(json.dumps(labfile.json_schema(), indent=2) + "\n")
    write_identity(root, project)
    # tflab.yaml last: a lab folder without it is not a lab, so an interrupted gen is no lab.
    (root / cfg.LAB_FILE).write_text(lab_yaml)
    return LabFiles(root=root, config=config, lab=lab)


def load(lab_dir: Path) -> LabConfig:
    """The lab in `lab_dir`, or a UserError saying there is none."""
    path = lab_dir / LAB_FILE
    if not path.is_file():
        raise UserError(f"no lab in {lab_dir} (no {LAB_FILE}); run `tflab gen` first or pass --lab DIR")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from exc
    return from_yaml(text, str(path))


def code_tasks(code_dir: Path) -> dict[str, Task]:
    """Tasks a code folder brings in its own tflab.yaml (the examples do)."""
    path = code_dir / LAB_FILE
    if not path.is_file():
        return {}
    return tasks_from_text(path.read_text(), str(path))
