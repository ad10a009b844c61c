"""The one way tflab runs external commands: argv lists, logged, failures raised."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Mapping, Sequence
from typing import Protocol

from tflab.errors import CommandError, UserError

log = logging.getLogger("tflab.proc")


class Runner(Protocol):
    """Runs an argv list and returns its standard output (raises CommandError on failure)."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: str | None = None,
    ) -> str: ...


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    input: str | None = None,
) -> str:
    """Run `argv`, return its stdout; raise CommandError with the combined output on failure."""
    argv = [str(a) for a in argv]
    log.debug("run: %s", " ".join(argv))
    try:
        done = subprocess.run(
            argv,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            input=input,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise UserError(f"`{argv[0]}` is not installed or not on PATH") from exc
    if done.returncode != 0:
        raise CommandError(argv, done.returncode, (done.stdout or "") + (done.stderr or ""))
    return done.stdout
