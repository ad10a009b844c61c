"""The files tflab ships beside its code: templates, node image files, examples, dataset, schemas.

They are package data of `tflab` (in this repository `tflab/templates` and friends are links
to the top-level folders), so an editable checkout and a wheel install find them the same
way: through importlib.resources.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from tflab.errors import TflabError

TEMPLATES = "templates"
NODE_IMAGE = "images/node"
EXAMPLES = "examples"
EXAMPLE_DATA = "examples/data"
SCHEMAS = "schemas"
# Never copied out of the package: caches Python writes beside the examples.
SKIPPED = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}


def path(name: str) -> Path:
    """The folder `name` (one of the constants above) of the installed package."""
    found = Path(str(files("tflab").joinpath(name)))
    if not found.is_dir():
        raise TflabError(
            f"tflab's own {name} folder is missing from {found.parent}: the installation is "
            "incomplete; reinstall tflab (pip install --force-reinstall tflab)"
        )
    return found


def example_files() -> dict[str, bytes]:
    """The bundled examples (their tflab.yaml included, their data folder not), by relative path."""
    root = path(EXAMPLES)
    data = path(EXAMPLE_DATA)
    out: dict[str, bytes] = {}
    for item in sorted(root.rglob("*")):
        if not item.is_file() or SKIPPED & set(item.relative_to(root).parts):
            continue
        if item.suffix in (".pyc", ".pyo") or data in item.parents:
            continue
        out[str(item.relative_to(root))] = item.read_bytes()
    return out


def example_data() -> dict[str, bytes]:
    """The small real dataset tflab ships (scikit-learn's handwritten digits), by file name."""
    return {p.name: p.read_bytes() for p in sorted(path(EXAMPLE_DATA).iterdir()) if p.is_file()}
