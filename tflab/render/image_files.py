"""The node image's build context: the Dockerfile, the node's own files, and the guard as one zipapp.

The guard is a package (images/node/tflab_guard); a node gets it as one file, guard.pyz,
made here byte for byte the same from the same sources (fixed times, stored, sorted), so the
image tag, a hash of the context, changes only when a file does.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

from tflab import resources
from tflab.plan import config as cfg
from tflab.plan.config import LabConfig
from tflab.render.templates import render

PY_SPY = "py-spy"  # the static py-spy binary of tflab's own environment (the `py-spy` wheel): where a node waits
GUARD_PACKAGE = "tflab_guard"
GUARD_FILE = "guard.pyz"
GUARD_MAIN = b"import sys\n\nfrom tflab_guard.cli import main\n\nsys.exit(main())\n"
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def default_base(config: LabConfig) -> str:
    """The Dockerfile's default base (tflab passes the resolved one as a build argument)."""
    return cfg.base_name(config.base_image, config.has_gpus, config.tensorflow)


def dockerfile(config: LabConfig) -> str:
    """The node Dockerfile's text."""
    return render("Dockerfile.j2", base_image=default_base(config))


def guard_zipapp() -> bytes:
    """The in-node guard package as one runnable file (`python3 guard.pyz VERB ...`)."""
    package = resources.path(resources.NODE_IMAGE) / GUARD_PACKAGE
    entries = [("__main__.py", GUARD_MAIN)]
    entries += [(f"{GUARD_PACKAGE}/{path.name}", path.read_bytes()) for path in sorted(package.glob("*.py"))]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return b"#!/usr/bin/env python3\n" + buffer.getvalue()


def node_files() -> dict[str, bytes]:
    """The node's own files as this tflab ships them (entrypoint, sshd's config, link shaping, the guard)."""
    folder = resources.path(resources.NODE_IMAGE)
    files = {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}
    files[GUARD_FILE] = guard_zipapp()
    spy = py_spy_binary()
    if spy is not None:
        files[PY_SPY] = spy.read_bytes()
    return dict(sorted(files.items()))


def py_spy_binary() -> Path | None:
    """py-spy as tflab's environment has it (a dependency: a static binary, so it runs in any node image), or None."""
    for folder in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(folder) / PY_SPY
        if candidate.is_file():
            return candidate
    found = shutil.which(PY_SPY)
    return Path(found) if found else None


PACKAGES_FILE = "packages.json"  # the lab's packages, in the image (`doctor` and `status` read them there)
REQUIREMENTS_DIR = "requirements"  # the code folder's requirements files, as they were at build time


def packages_files(config: LabConfig, requirements: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """The context's files that say the lab's packages (so that the image's tag changes with them)."""
    if not config.installs and not config.tensorflow:
        return {}
    doc: dict[str, object] = {"pip": list(config.packages.pip), "apt": list(config.packages.apt),
                              "tensorflow": config.tensorflow}
    if config.keras is not None:
        doc["keras"] = config.keras
    files = {PACKAGES_FILE: (json.dumps(doc, indent=1) + "\n").encode()}
    for name, content in sorted((requirements or {}).items()):
        files[f"{REQUIREMENTS_DIR}/{name}"] = content
    return files


def is_packages_file(name: str) -> bool:
    """Whether a context file is one of packages_files' (the rest are tflab's node files and the Dockerfile)."""
    return name == PACKAGES_FILE or name.startswith(REQUIREMENTS_DIR + "/")


def image_context(config: LabConfig, requirements: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """The node image's build context as `gen` writes it into the lab's image/ (the requirements files: read from the
    code folder); py-spy, tflab's own binary, joins it at build time (LabFiles.image_context), as the guard does."""
    written = {name: content for name, content in node_files().items() if name != PY_SPY}  # tflab's, added at build
    return {"Dockerfile": dockerfile(config).encode(), **written, **packages_files(config, requirements)}


def image_tag(context: dict[str, bytes], base_id: str = "") -> str:
    """The node image's tag: a hash of everything it is built from (its base image's id too)."""
    digest = hashlib.sha256(base_id.encode() + b"\0")
    for name in sorted(context):
        digest.update(name.encode() + b"\0" + context[name] + b"\0")
    return f"tflab-node:{digest.hexdigest()[:16]}"


def files_hash(files: dict[str, bytes]) -> str:
    """A short hash of node files (a base built with them is a node image already)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    return digest.hexdigest()[:16]
