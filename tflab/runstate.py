"""A run's decisions as a pure state machine: events in, actions out, no I/O and no clock.

The launcher feeds it what happens (a node's process started, printed a step, exited; a
server accepts; time passes; the user interrupts) and carries out what it returns (start,
release, stop, say, finish). Every verdict is decided here, from events alone, so it can
be tested with literal event lists.

The rules (DESIGN.md, "Tasks"):
- servers start first; the finishers (workers, chief) start held and are released once
  every server accepts on its port; sidecars (the evaluator) run beside them;
- the run succeeds when every finisher exited 0; then servers and sidecars are stopped;
- a finisher that fails stops the run (unless a restart is allowed), as does a server
  that exits while the finishers run, or one that never serves;
- after the chief finished, a finisher still running is hung once it has been silent for
  the grace period; one that never printed a step may be sleeping through TF1's
  MonitoredTrainingSession recovery wait (30 s), so it gets that much longer, and if it
  is still waiting then, the verdict names the cause and the cure (`device_filters`);
- a correct program is never called failed or hung: a late worker that ends after the
  chief (even 35 s after) is `ok`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflab.model import GRPC_PORT

SERVER, SIDECAR, FINISHER = "server", "sidecar", "finisher"


@dataclass(frozen=True)
class RunPlan:
    """Who does what in a run, and how patient to be."""

    servers: tuple[str, ...]
    finishers: tuple[str, ...]
    chief: str
    sidecars: tuple[str, ...] = ()
    grace_s: float = 30.0  # silence allowed after the chief finished
    timeout_s: float | None = None
    ready_timeout_s: float = 120.0
    restarts: int = 0  # per non-chief finisher
    recovery_wait_s: float = 30.0  # TF1 MonitoredTrainingSession's recovery_wait_secs
    task_index: dict[str, int] = field(default_factory=dict)  # for the device_filters hint


# -- events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Began:
    t: float


@dataclass(frozen=True)
class Serving:
    node: str
    t: float


@dataclass(frozen=True)
class Output:
    node: str
    t: float
    step: int | None = None


@dataclass(frozen=True)
class Exited:
    node: str
    code: int | None
    t: float
    reason: str | None = None  # why the code is unknown, or what happened to the node


@dataclass(frozen=True)
class Tick:
    t: float


@dataclass(frozen=True)
class Interrupted:
    t: float
    reason: str = "interrupted"
    force: bool = False


Event = Began | Serving | Output | Exited | Tick | Interrupted

# -- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    nodes: tuple[str, ...]
    held: bool = False
    attempt: int = 1


@dataclass(frozen=True)
class Release:
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    nodes: tuple[str, ...]
    force: bool = False


@dataclass(frozen=True)
class Say:
    message: str


@dataclass(frozen=True)
class Finish:
    exit_code: int
    verdict: str  # ok | failed | hung | timeout | interrupted
    problem: str | None = None


Action = Start | Release | Stop | Say | Finish


@dataclass
class NodeState:
    """What the machine knows of one node's process."""

    name: str
    role: str
    attempt: int = 0
    started: float | None = None  # released, for finishers
    ended: float | None = None
    exit_code: int | None = None
    verdict: str = "pending"  # pending | running | ok | failed | hung | served | stopped | ...
    reason: str | None = None
    last_output: float | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)
    serving: bool = False

    @property
    def running(self) -> bool:
        return self.started is not None and self.ended is None

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else self.started) - self.started


class RunMachine:
    """The verdict of one run, decided from events."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.nodes: dict[str, NodeState] = {}
        for name in plan.servers:
            self.nodes[name] = NodeState(name, SERVER)
        for name in plan.sidecars:
            self.nodes[name] = NodeState(name, SIDECAR)
        for name in plan.finishers:
            self.nodes[name] = NodeState(name, FINISHER)
        self.began: float | None = None
        self.released = False
        self.chief_ended: float | None = None
        self.restarts = {name: 0 for name in plan.finishers}
        self.finish: Finish | None = None
        self.hung_reported: set[str] = set()
        self.problems: list[str] = []

    # -- the one entry point -------------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """The actions `event` calls for."""
        if isinstance(event, Began):
            return self._began(event)
        if isinstance(event, Output):
            return self._output(event)
        if isinstance(event, Serving):
            return self._serving(event)
        if isinstance(event, Exited):
            return self._exited(event)
        if isinstance(event, Tick):
            return self._tick(event.t)
        if isinstance(event, Interrupted):
            return self._interrupted(event)
        raise TypeError(f"not an event: {event!r}")

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def running(self) -> list[str]:
        """Nodes whose process has started and not yet ended (held ones included)."""
        return [n.name for n in self.nodes.values() if n.attempt > 0 and n.ended is None]

    # -- events ----------------------------------------------------------------------------

    def _began(self, event: Began) -> list[Action]:
        self.began = event.t
        actions: list[Action] = []
        first = self.plan.servers + self.plan.sidecars
        for name in first:
            self._mark_started(name, event.t)
        if first:
            actions.append(Start(first))
        for name in self.plan.finishers:
            self.nodes[name].attempt = 1
            self.nodes[name].verdict = "held"
        if not self.plan.servers:
            actions.append(Start(self.plan.finishers))
            actions += self._release(event.t, announce=False)
        else:
            actions.append(Start(self.plan.finishers, held=True))
        return actions

    def _mark_started(self, name: str, t: float) -> None:
        node = self.nodes[name]
        node.attempt += 1
        node.started, node.ended, node.exit_code, node.reason = t, None, None, None
        node.verdict = "running"

    def _release(self, t: float, announce: bool = True) -> list[Action]:
        self.released = True
        for name in self.plan.finishers:
            node = self.nodes[name]
            if node.ended is None:
                node.started, node.verdict = t, "running"
        actions: list[Action] = []
        if announce:
            actions.append(Say(f"starting {', '.join(self.plan.finishers)}"))
            actions.append(Release(self.plan.finishers))
        return actions

    def _serving(self, event: Serving) -> list[Action]:
        node = self.nodes.get(event.node)
        if self.finished or node is None or node.role != SERVER or node.serving or node.ended is not None:
            return []
        node.serving = True
        actions: list[Action] = [Say(f"{event.node} is serving on {event.node}:{GRPC_PORT}")]
        if not self.released and all(self.nodes[s].serving for s in self.plan.servers):
            actions += self._release(event.t)
        return actions

    def _output(self, event: Output) -> list[Action]:
        node = self.nodes.get(event.node)
        if node is None:
            return []
        node.last_output = event.t
        if event.step is not None:
            node.steps.append((event.t, event.step))
        return []

    def _exited(self, event: Exited) -> list[Action]:
        node = self.nodes.get(event.node)
        if node is None or node.ended is not None:
            return []
        node.ended, node.exit_code = event.t, event.code
        if node.started is None:
            node.started = event.t  # ended while held
        node.reason = event.reason
        if node.verdict not in ("running", "held"):
            # Stopped on purpose (served, stopped, hung, interrupted ...): the verdict stands.
            return self._maybe_done()
        if self.finished:
            node.verdict = "stopped"
            return []
        how = self._how(event)
        if node.role == SERVER:
            node.verdict = "failed"
            when = "while the workers were running" if self.released else f"before serving on port {GRPC_PORT}"
            return self._fail(f"{event.node} {how} {when}")
        if node.role == SIDECAR:
            node.verdict = "ok" if event.code == 0 else "failed"
            return [] if event.code == 0 else [Say(f"{event.node} {how}; the run goes on without it")]
        if event.code == 0:
            node.verdict = "ok"
            if event.node == self.plan.chief:
                self.chief_ended = event.t
            return self._maybe_done()
        if event.node != self.plan.chief and self.restarts[event.node] < self.plan.restarts and event.code is not None:
            self.restarts[event.node] += 1
            node.verdict = "restarted"
            self._mark_started(event.node, event.t)
            return [
                Say(f"{event.node} {how}; restart {self.restarts[event.node]} of {self.plan.restarts}"),
                Start((event.node,), attempt=node.attempt),
            ]
        node.verdict = "failed"
        return self._fail(f"{event.node} failed: {how}" if event.code is None
                          else f"{event.node} failed with exit code {event.code}"
                          + (f" ({event.reason})" if event.reason else ""))

    @staticmethod
    def _how(event: Exited) -> str:
        if event.code is None:
            return f"ended with no exit code: {event.reason or 'unknown'}"
        text = f"exited with {event.code}"
        return f"{text} ({event.reason})" if event.reason else text

    def _tick(self, t: float) -> list[Action]:
        if self.finished or self.began is None:
            return []
        plan = self.plan
        if plan.timeout_s is not None and t - self.began > plan.timeout_s:
            return self._end("timeout", 1, f"the run passed its timeout of {plan.timeout_s:g}s",
                             verdict_for_running="timeout")
        if not self.released and t - self.began > plan.ready_timeout_s:
            late = [s for s in plan.servers if not self.nodes[s].serving]
            return self._fail(f"{', '.join(late)} did not serve on port {GRPC_PORT} within {plan.ready_timeout_s:g}s")
        if self.chief_ended is None:
            return []
        hung: list[str] = []
        for name in plan.finishers:
            node = self.nodes[name]
            if not node.running or name in self.hung_reported:
                continue
            if node.steps:
                quiet_since = max(self.chief_ended, node.last_output or self.chief_ended)
                deadline = quiet_since + plan.grace_s
            else:
                deadline = self.chief_ended + plan.recovery_wait_s + plan.grace_s
            if t > deadline:
                hung.append(name)
        if not hung:
            return []
        actions: list[Action] = []
        for name in hung:
            node = self.nodes[name]
            node.verdict = "hung"
            self.hung_reported.add(name)
            message = self._hung_message(name, t)
            node.reason = message
            self.problems.append(message)
        actions.append(Stop(tuple(hung)))
        return actions + self._maybe_done()

    def _hung_message(self, name: str, t: float) -> str:
        node = self.nodes[name]
        after = t - (self.chief_ended or t)
        if not node.steps:
            index = self.plan.task_index.get(name)
            task = f"/job:worker/task:{index}" if index is not None else "/job:worker/task:N"
            return (
                f"{name} never printed a training step and still waited {after:.0f}s after the chief "
                f"finished: reported hung and stopped. With TF1's MonitoredTrainingSession this is the "
                f"classic late worker: it asked before the chief was ready, slept through "
                f"recovery_wait_secs ({self.plan.recovery_wait_s:g}s), and its session now waits for the "
                f"chief's server forever; give the session "
                f'config=tf.compat.v1.ConfigProto(device_filters=["/job:ps", "{task}"])'
            )
        return (
            f"{name} still running {self.plan.grace_s:g}s after the chief finished, silent for "
            f"{t - max(self.chief_ended or t, node.last_output or 0):.0f}s: reported hung and stopped"
        )

    def _interrupted(self, event: Interrupted) -> list[Action]:
        if self.finished:
            still = tuple(self.running())
            return [Stop(still, force=True)] if event.force and still else []
        return self._end("interrupted", 130, event.reason, verdict_for_running="interrupted",
                         force=event.force)

    # -- endings ---------------------------------------------------------------------------

    def _maybe_done(self) -> list[Action]:
        if self.finished:
            return []
        finishers = [self.nodes[n] for n in self.plan.finishers]
        if any(n.ended is None for n in finishers):
            return []  # still running, or hung and being stopped: their exits end the run
        if all(n.verdict == "ok" for n in finishers):
            return self._end("ok", 0, None, verdict_for_running="served")
        if any(n.verdict == "hung" for n in finishers):
            return self._end("hung", 1, "; ".join(self.problems), verdict_for_running="stopped")
        return self._end("failed", 1, "; ".join(self.problems) or "not every worker succeeded",
                         verdict_for_running="stopped")

    def _fail(self, problem: str) -> list[Action]:
        return self._end("failed", 1, problem, verdict_for_running="stopped")

    def _end(self, verdict: str, code: int, problem: str | None, verdict_for_running: str,
             force: bool = False) -> list[Action]:
        still = self.running()
        for name in still:
            node = self.nodes[name]
            if node.verdict in ("running", "held"):
                role_verdict = verdict_for_running
                if verdict_for_running == "served" and node.role == SIDECAR:
                    role_verdict = "stopped"
                node.verdict = role_verdict
        self.finish = Finish(code, verdict, problem)
        actions: list[Action] = []
        if still:
            actions.append(Stop(tuple(still), force=force))
        actions.append(self.finish)
        return actions
