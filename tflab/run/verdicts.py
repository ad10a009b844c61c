"""The sentences a run's verdicts say (how a node ended, why a worker is hung, why one is not), and one node's verdict."""

from __future__ import annotations

from tflab.run.events import Exited, Finish
from tflab.run.noderun import NodeRun
from tflab.run.runplan import RunPlan
from tflab.run.waits import Wait, WaitKind
from tflab.run.words import Verdict


def how_it_ended(event: Exited) -> str:
    """'exited with 3 (the reason)', or 'ended with no exit code: why'."""
    if event.code is None:
        return f"ended with no exit code: {event.reason or 'unknown'}"
    text = f"exited with {event.code}"
    return f"{text} ({event.reason})" if event.reason else text  # the guard's sentence first (run/watch.py)


def hung_message(plan: RunPlan, node: NodeRun, t: float, chief_ended: float | None) -> str:
    """Why `node`, still running at `t` after the chief ended, is hung, from where its stacks show it waits: the late
    worker's cause and cure only where it waits in TF1's SessionManager; else where it waits, and no guessed cure."""
    name = node.name
    after = t - (chief_ended or t)
    what = ("reported hung and stopped" if plan.stop_hung
            else "it looks hung (Ctrl-C stops it; with --grace tflab stops it)")
    wait = node.wait
    if not node.progressed:
        if wait is not None and wait.kind == WaitKind.SESSION:
            index = plan.task_index.get(name)
            task = f"/job:worker/task:{index}" if index is not None else "/job:worker/task:N"
            return (
                f"{name} never printed a training step and still waited {after:.0f}s after the chief "
                f"finished, in TF1's SessionManager ({wait.at}): {what}. This is the classic late worker: it asked "
                f"before the chief was ready, slept through recovery_wait_secs ({plan.recovery_wait_s:g}s), and its "
                f"session now waits for the chief's server forever; give the session "
                f'config=tf.compat.v1.ConfigProto(device_filters=["/job:ps", "{task}"])'
            )
        return f"{name} never printed a training step and still waited {after:.0f}s after the chief finished{_where(wait)}: {what}"
    return (
        f"{name} still running {plan.grace_s:g}s after the chief finished, silent for "
        f"{t - max(chief_ended or t, node.last_output or 0):.0f}s{_where(wait)}: {what}"
    )


def _where(wait: Wait | None) -> str:
    """`, in the program's own code (f (a.py:3) ← ...)`: where its stacks show it waits, or that they could not be read."""
    if wait is None or wait.kind == WaitKind.UNKNOWN:
        return " (where it waits could not be read)"
    if wait.kind == WaitKind.OWN:
        return f", waiting in the program's own code ({wait.at})"
    if wait.kind == WaitKind.SERVES:
        return f", serving in Server.join() ({wait.at})"
    return f", waiting in TensorFlow ({wait.at})"


def served_message(plan: RunPlan, name: str) -> str:
    """Why `name`, a worker that never trained and waits in Server.join() after the chief succeeded, is no hung worker."""
    return (f"{name} served: it never trained, and waits in TensorFlow's Server.join() now that the chief "
            f"({plan.chief}) has succeeded: stopped as a parameter server is (a TFJob succeeds with its chief). "
            "A task whose workers only serve says so in tflab.yaml: `servers: [ps, worker]`")


def teardown_message(plan: RunPlan, name: str, after: float) -> str:
    """Why `name`, trained and still in TensorFlow's teardown `after` seconds past the chief, is no hung worker."""
    chief = plan.chief
    if not plan.stop_hung:
        return (f"{name} finished training and still waits {after:.0f}s after {chief} in TensorFlow's teardown, "
                f"for the coordination service that ended with {chief} (Ctrl-C stops it)")
    return (f"{name} finished training, then stayed {after:.0f}s in TensorFlow's teardown, calling the "
            f"coordination service that ended with {chief}: stopped, and counted as finished "
            f"(a cluster's job succeeds when its chief does)")


def node_verdict(finish: Finish, node: NodeRun) -> Finish:
    """A decided run as one node's `tflab exec` reports it: the node's own exit code where it ended by itself,
    else what ended it (130 interrupted, 1 hung or stalled, 137 out of memory, 255 no exit code)."""
    if finish.verdict == Verdict.INTERRUPTED:
        return Finish(130, Verdict.INTERRUPTED, finish.problem)
    if node.verdict == Verdict.OK:
        return Finish(0, Verdict.OK)  # ended 0, or trained and was stopped in TensorFlow's teardown
    if node.verdict in (Verdict.HUNG, Verdict.STALLED):
        return Finish(1, node.verdict, finish.problem)
    if node.verdict == Verdict.OOM:
        return Finish(node.exit_code or 137, Verdict.OOM, finish.problem)
    if node.exit_code is None:
        return Finish(255, Verdict.FAILED, finish.problem or f"{node.name} ended with no exit code: {node.reason}")
    return Finish(node.exit_code, Verdict.FAILED, finish.problem)
