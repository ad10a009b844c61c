"""`tflab run`: servers first and waited on, then workers, supervised to a verdict."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import docker
from docker.models.containers import Container

from tflab import nodes
from tflab.config import Task
from tflab.errors import EngineError
from tflab.model import GRPC_PORT, Lab, Node

PID_DIR = "/run/tflab"
STEP_PATTERN = re.compile(r"\bstep[ =:]+(\d+)", re.IGNORECASE)
OnLine = Callable[[str, str], None]
OnEvent = Callable[[str], None]


def start_order(lab: Lab, task: Task) -> tuple[list[Node], list[Node]]:
    """(servers, finishers): servers start first and only serve; the run ends with the finishers.

    The evaluator is neither: it runs beside the finishers and is stopped with the servers.
    """
    servers = [n for n in lab.nodes if n.job in task.servers]
    finishers = [n for n in lab.nodes if n.job not in task.servers and n.job != "evaluator"]
    sidecars = [n for n in lab.nodes if n.job == "evaluator" and n.job not in task.servers]
    return servers + sidecars, finishers


@dataclass
class NodeRun:
    """One node's process in a run."""

    node: Node
    role: str  # server | finisher
    argv: list[str]
    attempt: int = 1
    started: float = 0.0
    ended: float | None = None
    exit_code: int | None = None
    verdict: str = "running"
    steps: list[tuple[float, int]] = field(default_factory=list)

    @property
    def duration(self) -> float:
        """Seconds it ran (until now while running)."""
        return (self.ended or time.monotonic()) - self.started

    def steps_per_second(self, window_s: float | None = None) -> float | None:
        """Training steps per second from the `step N` lines it printed (over the last `window_s`)."""
        steps = self.steps
        if window_s is not None and steps:
            steps = [s for s in steps if s[0] >= steps[-1][0] - window_s]
        if len(steps) < 2:
            return None
        (t0, s0), (t1, s1) = steps[0], steps[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None


@dataclass(frozen=True)
class RunOptions:
    """How `run` supervises."""

    grace_s: float = 30.0  # how long workers may outlive the chief before they count as hung
    timeout_s: float | None = None  # the whole run
    ready_timeout_s: float = 120.0  # a server's port must accept within this
    restarts: int = 0  # restarts allowed per failed (non-chief) worker
    stop_grace_s: float = 3.0  # SIGTERM to SIGKILL
    report_every_s: float = 10.0  # how often the live steps/s line is shown


def wrapped(run_id: str, node: str, argv: Sequence[str]) -> list[str]:
    """argv with its process group id written down, so the run can stop all it started.

    A `docker exec` process leads its own process group already; the task inherits it.
    """
    script = f'mkdir -p {PID_DIR}; echo $$ > {PID_DIR}/{run_id}-{node}.pid; exec "$@"'
    return ["sh", "-c", script, "sh", *argv]


def stop_script(run_id: str, node: str, grace_s: float) -> list[str]:
    """Stop a node's task group: SIGTERM, then SIGKILL after `grace_s` (some TF servers ignore TERM)."""
    pid_file = f"{PID_DIR}/{run_id}-{node}.pid"
    rounds = max(1, int(grace_s / 0.1))
    script = (
        f'[ -f {pid_file} ] || exit 0; p=$(cat {pid_file}); '
        f'kill -TERM -"$p" 2>/dev/null || {{ rm -f {pid_file}; exit 0; }}; '
        f'i=0; while [ $i -lt {rounds} ]; do kill -0 -"$p" 2>/dev/null || {{ rm -f {pid_file}; exit 0; }}; '
        f'sleep 0.1; i=$((i+1)); done; kill -KILL -"$p" 2>/dev/null; rm -f {pid_file}; exit 0'
    )
    return ["sh", "-c", script]


def port_probe(host: str) -> list[str]:
    """A command, run inside a node, that succeeds once host:2222 accepts connections."""
    code = f"import socket; socket.create_connection(({host!r}, {GRPC_PORT}), 1).close()"
    return ["python3", "-c", code]


class Supervisor:
    """Runs one task across the lab and decides its verdict."""

    def __init__(
        self, client: docker.DockerClient, containers: dict[str, Container], lab: Lab,
        task: Task, commands: dict[str, list[str]], env: dict[str, str], log_dir: Path,
        on_line: OnLine, on_event: OnEvent, options: RunOptions,
    ) -> None:
        self.client = client
        self.containers = containers
        self.lab = lab
        self.task = task
        self.commands = commands
        self.env = env
        self.log_dir = log_dir
        self.on_line = on_line
        self.on_event = on_event
        self.options = options
        self.run_id = f"{task.name}-{int(time.time() * 1000)}"
        self.done: queue.Queue[NodeRun] = queue.Queue()
        self.runs: dict[str, NodeRun] = {}
        self.problem: str | None = None
        self._lock = threading.Lock()

    # -- processes -------------------------------------------------------------------------

    def _start(self, node: Node, role: str, attempt: int = 1) -> NodeRun:
        run = NodeRun(node, role, self.commands[node.name], attempt=attempt, started=time.monotonic())
        self.runs[node.name] = run
        thread = threading.Thread(target=self._pump, args=(run,), daemon=True, name=f"run-{node.name}")
        thread.start()
        return run

    def _pump(self, run: NodeRun) -> None:
        name = run.node.name
        buffer = b""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{name}.log").open("ab") as log:

            def take(chunk: bytes, _is_err: bool) -> None:
                nonlocal buffer
                log.write(chunk)
                log.flush()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    self._line(run, raw.decode(errors="replace").rstrip("\r"))

            try:
                code = nodes.exec_stream(
                    self.client, self.containers[name], wrapped(self.run_id, name, run.argv), take,
                    env=self.env,
                )
            except (EngineError, docker.errors.DockerException) as exc:
                self._line(run, f"tflab: lost the process: {exc}")
                code = 255
            if buffer:
                self._line(run, buffer.decode(errors="replace"))
        run.exit_code = code
        run.ended = time.monotonic()
        self.done.put(run)

    def _line(self, run: NodeRun, line: str) -> None:
        match = STEP_PATTERN.search(line)
        if match:
            run.steps.append((time.monotonic(), int(match.group(1))))
        with self._lock:
            self.on_line(run.node.name, line)

    def stop(self, names: Sequence[str], verdict: str) -> None:
        """Stop these nodes' tasks (whole process groups) and mark the ones still running."""
        threads = []
        for name in names:
            run = self.runs.get(name)
            if run is not None and run.ended is None and run.verdict == "running":
                run.verdict = verdict
            threads.append(threading.Thread(target=self._kill, args=(name,), daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=self.options.stop_grace_s + 10)

    def _kill(self, name: str) -> None:
        try:
            nodes.exec_quiet(self.client, self.containers[name],
                             stop_script(self.run_id, name, self.options.stop_grace_s))
        except (EngineError, docker.errors.DockerException):
            pass  # the node itself is gone: nothing of the task is left in it

    def _wait_ended(self, names: Sequence[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if all(self.runs[n].ended is not None for n in names if n in self.runs):
                return
            try:
                self._record(self.done.get(timeout=0.1))
            except queue.Empty:
                pass

    def _record(self, run: NodeRun) -> None:
        if run.verdict == "running":
            run.verdict = "ok" if run.exit_code == 0 else "failed"

    # -- the run ---------------------------------------------------------------------------

    def wait_serving(self, server: NodeRun, deadline: float) -> None:
        """Wait until the server's gRPC port accepts connections (or it dies, or time runs out)."""
        name = server.node.name
        while time.monotonic() < deadline:
            if server.ended is not None:
                raise _RunFailed(f"{name} exited with {server.exit_code} before serving on port {GRPC_PORT}")
            code, _ = nodes.exec_quiet(self.client, self.containers[name], port_probe(name))
            if code == 0:
                self.on_event(f"{name} is serving on {name}:{GRPC_PORT}")
                return
            time.sleep(0.2)
        raise _RunFailed(f"{name} did not serve on port {GRPC_PORT} within {self.options.ready_timeout_s:.0f}s")

    def execute(self) -> list[NodeRun]:
        """Run the task to its verdict; every process it started is stopped when it returns."""
        servers, finishers = start_order(self.lab, self.task)
        started_at = time.monotonic()
        deadline = started_at + self.options.timeout_s if self.options.timeout_s else None
        try:
            for node in servers:
                self._start(node, "server")
            ready_deadline = time.monotonic() + self.options.ready_timeout_s
            for node in servers:
                if node.job in self.task.servers and node.job != "evaluator":
                    self.wait_serving(self.runs[node.name], ready_deadline)
            self.on_event(f"starting {', '.join(n.name for n in finishers)}")
            for node in finishers:
                self._start(node, "finisher")
            self._supervise(servers, finishers, deadline)
        except _RunFailed as failed:
            self.problem = str(failed)
        except KeyboardInterrupt:
            self.problem = "interrupted"
            self.stop(list(self.runs), "interrupted")
            raise
        finally:
            still = [n for n, r in self.runs.items() if r.ended is None]
            if still:
                self.stop(still, "stopped")
                self._wait_ended(still, self.options.stop_grace_s + 10)
            for name in self.containers:
                self._kill(name)  # a last sweep: no task process of this run stays behind
        return [self.runs[n.name] for n in self.lab.nodes if n.name in self.runs]

    def _supervise(self, servers: list[Node], finishers: list[Node], deadline: float | None) -> None:
        chief = self.lab.chief.name
        chief_ended: float | None = None
        restarts = {n.name: 0 for n in finishers}
        names = [n.name for n in finishers]
        last_report = time.monotonic()
        while True:
            try:
                run = self.done.get(timeout=0.2)
            except queue.Empty:
                run = None
            now = time.monotonic()
            if now - last_report >= self.options.report_every_s:
                last_report = now
                self._report_rates(names)
            if run is not None:
                self._record(run)
                name = run.node.name
                if run.role == "server" and any(self.runs[n].ended is None for n in names):
                    run.verdict = "failed"
                    raise _RunFailed(f"{name} exited with {run.exit_code} while workers were running")
                if run.role == "finisher" and run.exit_code != 0:
                    if name != chief and restarts[name] < self.options.restarts and run.verdict == "failed":
                        restarts[name] += 1
                        self.on_event(f"{name} exited with {run.exit_code}; restart {restarts[name]} of {self.options.restarts}")
                        run.verdict = "restarted"
                        self._start(run.node, "finisher", attempt=run.attempt + 1)
                        continue
                    if run.verdict == "failed":
                        others = [n for n, r in self.runs.items() if r.ended is None]
                        self.stop(others, "stopped")
                        raise _RunFailed(f"{name} failed with exit code {run.exit_code}")
                if name == chief and run.exit_code == 0:
                    chief_ended = now
            if all(self.runs[n].ended is not None for n in names):
                self.stop([n.name for n in servers], "served")
                return
            if chief_ended is not None and now - chief_ended > self.options.grace_s:
                hung = [n for n in names if self.runs[n].ended is None]
                self.stop(hung, "hung")
                raise _RunFailed(
                    f"{', '.join(hung)} still running {self.options.grace_s:.0f}s after the chief "
                    "finished: reported hung and stopped"
                )
            if deadline is not None and now > deadline:
                raise _RunFailed(f"the run passed its timeout of {self.options.timeout_s:.0f}s")


    def _report_rates(self, names: Sequence[str]) -> None:
        """The live line: each running worker's steps per second over the last interval."""
        rates = []
        for name in names:
            run = self.runs[name]
            rate = run.steps_per_second(self.options.report_every_s * 1.5)
            if run.ended is None and rate is not None:
                rates.append(f"{name} {rate:.1f}")
        if rates:
            self.on_event("steps/s: " + ", ".join(rates))


class _RunFailed(Exception):
    """Ends a run early; the message is the run's verdict."""


def succeeded(runs: Sequence[NodeRun]) -> bool:
    """A run succeeds when every finisher (chief and workers) exited 0."""
    finishers = [r for r in runs if r.role == "finisher"]
    return bool(finishers) and all(r.verdict == "ok" for r in finishers)

