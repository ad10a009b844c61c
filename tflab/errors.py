"""The errors tflab raises. Lower layers raise; only the CLI turns them into exit codes."""

from __future__ import annotations


class TflabError(Exception):
    """Base of every error tflab raises on purpose."""

    exit_code = 1


class UserError(TflabError):
    """Something the user can fix; the message says what is wrong and what to do."""

    exit_code = 2


class EngineError(TflabError):
    """Docker (the engine or compose) failed or cannot be reached; the message is advice."""

    exit_code = 3


class Interrupted(TflabError):
    """The user stopped tflab (Ctrl-C, SIGTERM, SIGHUP) while it waited."""

    exit_code = 130


class CommandError(TflabError):
    """An external command exited non-zero."""

    def __init__(self, argv: list[str], returncode: int, output: str) -> None:
        self.argv = argv
        self.returncode = returncode
        self.output = output
        tail = output.strip().splitlines()[-1] if output.strip() else "no output"
        super().__init__(f"`{' '.join(argv)}` exited with {returncode}: {tail}")
