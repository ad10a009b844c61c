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
    """An external command failed: it exited non-zero, or did not finish in time (`returncode` None)."""

    def __init__(self, argv: list[str], returncode: int | None, stdout: str = "", stderr: str = "",
                 why: str | None = None) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = self.output.strip().splitlines()[-1] if self.output.strip() else "no output"
        what = why or f"exited with {returncode}"
        super().__init__(f"`{' '.join(argv)}` {what}: {tail}")

    @property
    def output(self) -> str:
        """Both outputs, stdout first."""
        return self.stdout + self.stderr
