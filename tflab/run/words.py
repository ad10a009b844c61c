"""The run's verdicts, declared once: a node's and a run's.

They are strings too (StrEnum): run.json, `tflab runs` and the summary say them as they are,
and a verdict read back from an older run.json compares equal to its word. The words of how a
process ended are the guard's (tflab_guard.protocol: `Ending.reason`, and `RECORD_REASONS`
for run.json's `reason`).
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """A node's verdict in a run (run.json's `nodes.NODE.verdict`), and a run's own (its Finish)."""

    PENDING = "pending"  # not started yet
    HELD = "held"  # started, waiting for its servers before it is released
    RUNNING = "running"
    OK = "ok"  # a finisher that exited with 0; a run that succeeded
    SERVED = "served"  # a server stopped once the finishers were done (servers never exit on their own)
    STOPPED = "stopped"  # stopped by tflab because the run ended for another reason
    RESTARTED = "restarted"  # this attempt failed and the node was started again (--restarts)
    RESTARTING = "restarting"  # a drill brings its machine back
    FAILED = "failed"
    HUNG = "hung"  # still waiting after the chief finished
    STALLED = "stalled"  # no step and no CPU for --stall seconds while the others waited
    OOM = "oom"  # the kernel's out-of-memory killer ended it
    TIMEOUT = "timeout"  # the run passed its --timeout
    INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, a closed stdout
    KILLED = "killed"  # a drill killed its machine
    SHUT_DOWN = "shut down"  # a drill stopped its machine
    REBOOTED = "rebooted"  # a drill restarted its machine
    SURVIVED = "survived"  # a drill expected a failure, and the run survived
    MISSED = "missed"  # a drill expected survival, and the run did not
    ABANDONED = "abandoned"  # run.json says running, but its tflab is gone

