"""The type checker over tflab/: clean, and it catches a backend that breaks the LabBackend promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def mypy(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def test_tflab_type_checks_clean() -> None:
    done = mypy()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout


def test_a_backend_missing_a_verb_fails_the_check(tmp_path: Path) -> None:
    """What `engine/sides.py` does, with a backend that has `down` and lacks the rest (the swarm lab once lacked `exec`)."""
    broken = tmp_path / "broken_side.py"
    broken.write_text(
        "from tflab.engine.backend import LabBackend\n\n\n"
        "class Lacking:\n"
        "    def __init__(self, lf) -> None:\n"
        "        self.lf = lf\n\n"
        "    def down(self) -> tuple[int, int]:\n"
        "        return (0, 0)\n\n\n"
        "def pick(lf) -> LabBackend:\n"
        "    side: LabBackend = Lacking(lf)\n"
        "    return side\n")
    done = mypy("--no-incremental", str(broken), cwd=REPO)
    assert done.returncode != 0, done.stdout
    assert 'Incompatible types in assignment (expression has type "Lacking", variable has type "LabBackend")' \
        in done.stdout, done.stdout
