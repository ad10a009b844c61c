"""What the real guard answers, for the host-side tests' fake nodes: held to the real guard.pyz by
tests/test_guard.py::test_the_fakes_answer_ended_as_the_real_guard_does."""

from __future__ import annotations

from tflab_guard.protocol import Ending


def ended(code: int | None, stopped: bool) -> tuple[int, str]:
    """The guard's `ended KEY` (exit code, output) for a program that exited with `code`, or that tflab stopped."""
    if stopped:
        return 0, Ending(143, "SIGTERM", "stopped").to_json() + "\n"
    if code is None:
        return 1, "unknown\n"
    return 0, Ending(code).to_json() + "\n"
