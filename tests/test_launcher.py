"""The run's process I/O with fake executors: every exit processed, readers that always report."""

from __future__ import annotations

import fnmatch
import threading
import time
from pathlib import Path

import pytest

import fakeguard
from tflab_guard import protocol
from tflab.engine import guardcmd, guardwait
from tflab.plan.config import Task
from tflab.plan.tasks import servers_for_exec, start_order
from tflab.plan.topology import Topology, plan
from tflab.run.launcher import Launcher, RunSetup
from tflab.run.runplan import RunPlan, run_plan


class FakeProcess:
    """A node process that, once released, prints its lines and exits; closing its input stops it."""

    def __init__(self, lines: list[str], code: int | None, delay: float, held: bool, on_output, on_exit,
                 hang: bool = False, output_error: bool = False) -> None:
        self.released = threading.Event()
        self.closed = threading.Event()
        self.ended = threading.Event()
        if not held:
            self.released.set()
        self.args = (lines, code, delay, on_output, on_exit, hang)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        lines, code, delay, on_output, on_exit, hang = self.args
        self.code = code
        try:
            while not self.released.wait(0.01):
                if self.closed.is_set():
                    self.code = 143
                    return
            for line in lines:
                on_output(f"{line}\n".encode(), False)
            if self.closed.wait(delay if not hang else 3600):
                self.code = 143
        finally:
            self.ended.set()
            on_exit(fakeguard.end(self.code, self.closed.is_set()))

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.closed.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.ended.wait(timeout)


class FakeExecutor:
    """Scripts per node: (lines, exit code, seconds before exiting, hangs). The servers serve at once (`serving`
    True), never (False), or that many seconds after they were made, using the CPU until then when `busy`."""

    def __init__(self, scripts: dict[str, tuple[list[str], int | None, float, bool]],
                 serving: bool | float = True, busy: bool = False, broken_start: set[str] | None = None,
                 stacks: dict[str, str] | None = None) -> None:
        self.scripts = scripts
        self.stacks = stacks or {}  # node -> the real dump (tests/fixtures/stacks) its running process shows
        made = time.monotonic()
        self.serves_at = (made if serving is True else None if serving is False else made + serving)
        self.busy = busy
        self.broken_start = broken_start or set()
        self.processes: dict[str, FakeProcess] = {}
        self.commands: list[tuple[str, list[str]]] = []
        self.spawned: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        if node in self.broken_start:
            from tflab.errors import EngineError

            raise EngineError(f"starting a process in {node} failed: no such container")
        lines, code, delay, hang = self.scripts[node]
        with self.lock:
            self.commands.append((node, list(argv)))
        process = FakeProcess(lines, code, delay, "--wait-for-go" in argv, on_output, on_exit, hang)
        self.processes[node] = process
        return process

    def run(self, node, argv, env=None, workdir="/"):
        with self.lock:
            self.commands.append((node, list(argv)))
        if "probe" in argv:
            return fakeguard.probe(argv, self.serves_at, self.busy)
        if argv[2] == "ended" and node in self.processes:
            process = self.processes[node]
            return fakeguard.ended(process.code, process.closed.is_set())
        if "stop" in argv and node in self.processes:
            self.processes[node].close()
        if argv[2] == "stack":
            running = node in self.processes and not self.processes[node].ended.is_set()
            return fakeguard.stack(self.stacks.get(node) if running else None)
        return 0, ""

    def spawn(self, node, argv, env=None, workdir="/"):
        with self.lock:
            self.spawned.append((node, list(argv)))


class Lines:
    def __init__(self, fail_after: int | None = None) -> None:
        self.lines: list[tuple[str, str]] = []
        self.events: list[str] = []
        self.updates: list[tuple[str, str]] = []
        self.fail_after = fail_after

    def line(self, node: str, text: str) -> None:
        if self.fail_after is not None and len(self.lines) >= self.fail_after:
            raise BrokenPipeError("stdout closed")
        self.lines.append((node, text))

    def event(self, message: str) -> None:
        self.events.append(message)

    def update(self, node: str, text: str) -> None:
        self.updates.append((node, text))


LAB = plan(Topology(nodes=4), [])
TRAIN = Task("train", "python t.py")


def launch(tmp_path: Path, scripts, plan_: RunPlan | None = None, sink: Lines | None = None, **kw):
    executor = FakeExecutor(scripts, **kw)
    setup = RunSetup("train", {n: f"python t.py --node {n}" for n in LAB.names}, {"TFLAB_TASK": "train"},
                     tmp_path / "logs", stop_grace_s=0.2)
    launcher = Launcher(executor, plan_ or run_plan(LAB, TRAIN, grace_s=1.0), setup, sink or Lines())
    return launcher, executor


def ok_scripts(delay: float = 0.05) -> dict:
    return {
        "ps0": (["serving"], 143, 3600, True),
        "worker0": (["step 1", "worker0: test accuracy 0.97"], 0, delay, False),
        "worker1": (["step 1"], 0, delay, False),
        "worker2": (["step 1"], 0, delay, False),
    }


def test_start_order_and_exec_servers() -> None:
    servers, sidecars, finishers = start_order(plan(Topology(nodes=3, chief=True, evaluator=True), []),
                                               Task("pss", "x", ("ps", "worker")))
    assert [n.name for n in servers] == ["ps0", "worker0", "worker1"]
    assert [n.name for n in sidecars] == ["evaluator"] and [n.name for n in finishers] == ["chief"]
    assert [n.name for n in servers_for_exec(LAB, TRAIN, "worker1")] == ["ps0"]
    assert servers_for_exec(LAB, TRAIN, "ps0") == []


def test_workers_ending_together_always_succeed(tmp_path: Path) -> None:
    for _ in range(25):
        launcher, executor = launch(tmp_path, ok_scripts(delay=0.0))
        result = launcher.execute()
        assert result.finish.exit_code == 0, result.finish
        assert {n: s.verdict for n, s in result.machine.nodes.items()} == {
            "ps0": "served", "worker0": "ok", "worker1": "ok", "worker2": "ok"}
        assert result.result_line == "worker0: test accuracy 0.97"


def test_the_result_is_the_chiefs_own_last_line_not_an_error_tensorflow_logs_at_exit(tmp_path: Path) -> None:
    scripts = ok_scripts()
    crashed = ("E1124 21:59:02.000000  1203 coordination_service_agent.cc:512] Failed to disconnect from "
               "coordination service: The tasks have crashed. Check the task logs for an earlier error")
    scripts["worker0"] = (["step 1", "I1124 21:59:01.000000 140 train.py:80] test accuracy 0.98", crashed],
                          0, 0.05, False)
    result = launch(tmp_path, scripts)[0].execute()
    assert result.finish.exit_code == 0
    assert result.result_line == "I1124 21:59:01.000000 140 train.py:80] test accuracy 0.98"


def test_workers_start_held_and_cold_and_only_a_process_whose_end_is_unknown_is_cleared(tmp_path: Path) -> None:
    """Each ending comes in the trip that started its process (the guard's end line): nothing is asked or stopped
    after a run whose processes all said how they ended; one whose end is unknown is stopped by its task's key."""
    launcher, executor = launch(tmp_path, ok_scripts())
    launcher.execute()
    starts = {node: argv for node, argv in executor.commands if "run" in argv and "--shell" in argv}
    assert "--wait-for-go" in starts["worker1"] and "--wait-for-go" not in starts["ps0"]
    assert all("--end-in-stream" in argv for argv in starts.values())
    assert starts["worker1"][-1] == "python t.py --node worker1"
    assert [(node, argv[2]) for node, argv in executor.commands if argv[2] != "run"] == [("ps0", "probe")]
    assert (tmp_path / "logs" / "worker0.log").read_text() == "step 1\nworker0: test accuracy 0.97\n"
    scripts = ok_scripts()
    scripts["worker2"] = (["step 1"], None, 0.05, False)  # its connection brought no end, nor can its node say
    launcher, executor = launch(tmp_path, scripts)
    launcher.execute()
    sweeps = [(node, argv[argv.index("stop") + 1]) for node, argv in executor.commands if "stop" in argv]
    assert [node for node, _ in sweeps] == ["worker2"]
    # What a sweep matches, as the guard matches it: this task's processes, not another's nor an exec's.
    pattern = sweeps[0][1]
    assert all(p == pattern for _, p in sweeps)
    assert [k for k in (protocol.run_key("train", "worker1"), protocol.run_key("train", "ps0"),
                        protocol.run_key("train.v2", "worker1"), protocol.run_key("train-2", "worker1"),
                        protocol.exec_key("train", "worker1", "42"), protocol.serve_key("train", "ps0"))
            if fnmatch.fnmatchcase(k, pattern)] == ["run:train:worker1", "run:train:ps0"]


def test_a_broken_output_never_hangs_the_run(tmp_path: Path) -> None:
    sink = Lines(fail_after=1)
    launcher, _ = launch(tmp_path, ok_scripts(), sink=sink)
    started = time.monotonic()
    result = launcher.execute()
    assert time.monotonic() - started < 20
    assert result.finish == result.machine.finish
    assert (result.finish.exit_code, result.finish.problem) == (130, "the output failed (BrokenPipeError: stdout closed)")


def test_a_process_that_cannot_start_fails_the_run_naming_it(tmp_path: Path) -> None:
    launcher, _ = launch(tmp_path, ok_scripts(), broken_start={"worker2"})
    result = launcher.execute()
    assert result.finish.exit_code == 1
    assert result.finish.problem == ("worker2 failed: ended with no exit code: starting a process in worker2 "
                                     "failed: no such container")


def test_an_interrupt_stops_every_process(tmp_path: Path) -> None:
    scripts = ok_scripts(delay=3600)
    launcher, executor = launch(tmp_path, scripts)
    threading.Timer(0.5, launcher.interrupt, args=("interrupted (Ctrl-C)",)).start()
    result = launcher.execute()
    assert result.finish.exit_code == 130
    assert all(p.ended.is_set() for p in executor.processes.values())


def test_a_hung_worker_is_stopped_after_the_grace(tmp_path: Path) -> None:
    scripts = ok_scripts()
    scripts["worker2"] = (["step 1"], 0, 3600, True)
    launcher, executor = launch(tmp_path, scripts)
    started = time.monotonic()
    result = launcher.execute()
    assert 1.0 <= time.monotonic() - started < 15
    assert result.finish.verdict == "hung" and result.machine.nodes["worker2"].verdict == "hung"
    assert executor.processes["worker2"].ended.is_set()


def test_servers_that_never_serve_fail_the_run(tmp_path: Path) -> None:
    plan_ = RunPlan(servers=("ps0",), finishers=("worker0", "worker1", "worker2"), chief="worker0",
                    ready_timeout_s=0.5)
    launcher, executor = launch(tmp_path, ok_scripts(), plan_=plan_, serving=False)
    result = launcher.execute()
    assert result.finish.problem == ("ps0 did not serve on port 2222 within 0.5s, and its processes used no CPU in "
                                     "the last 0.5s: it is stuck")
    assert all(p.ended.is_set() for p in executor.processes.values())


def test_a_server_busy_starting_past_the_ready_timeout_is_waited_for_and_said(tmp_path: Path) -> None:
    """A ps in a node held to 0.1 CPU imports TensorFlow for minutes: no cluster's workers would give up on it
    at a clock (CI's run: 'ps0 did not serve on port 2222 within 120s', a starved ps that was still starting)."""
    plan_ = RunPlan(servers=("ps0",), finishers=("worker0", "worker1", "worker2"), chief="worker0",
                    ready_timeout_s=0.3)
    sink = Lines()
    launcher, executor = launch(tmp_path, ok_scripts(), plan_=plan_, sink=sink, serving=1.0, busy=True)
    result = launcher.execute()
    assert result.finish.exit_code == 0, result.finish
    said = [e for e in sink.events if "busy starting" in e]
    assert said == ["ps0 has not served on port 2222 within 0.3s, but it is busy starting (0.3 CPU-s in that time): "
                    "waiting while it uses the CPU"], sink.events
    probes = [argv for node, argv in executor.commands if "probe" in argv]
    assert len(probes) >= 2 and all("--quiet" in argv for argv in probes)


def test_guard_commands_carry_the_key_and_the_command_line() -> None:
    argv = guardcmd.run_line("run:train:worker1", "python a.py --x=1", held=True)
    assert argv[:4] == ["python3", "/usr/local/share/tflab/guard.pyz", "run", "run:train:worker1"]
    assert "--wait-for-go" in argv and argv[-2:] == ["--shell", "python a.py --x=1"]


def test_the_quality_a_chief_prints_is_kept_as_numbers_with_its_times(tmp_path: Path) -> None:
    """Issue 37: accuracy and loss read as the steps are, into run.json's quality and quality_series."""
    from tflab.run.history import quality_of

    scripts = ok_scripts()
    scripts["worker0"] = (["worker0: global step 100 loss 0.5000 accuracy 0.8100 (40.0 steps/s here)",
                           "worker0: global step 200 loss 0.2000 accuracy 0.9500 (40.0 steps/s here)",
                           "worker0: test accuracy 0.9611"], 0, 0.05, False)
    scripts["worker1"] = (["worker1: global step 150 loss 0.3000 (40.0 steps/s here)"], 0, 0.05, False)
    result = launch(tmp_path, scripts)[0].execute()
    assert result.finish.exit_code == 0
    found = quality_of(result.machine)
    assert found["quality"] == {"loss": 0.2, "accuracy": 0.9611}, "the chief's own, as it last printed them"
    assert [value for _, value in found["quality_series"]["accuracy"]] == [0.81, 0.95, 0.9611]
    times = [t for t, _ in found["quality_series"]["accuracy"]]
    assert times == sorted(times) and times[0] >= 0


def test_a_bar_being_redrawn_is_updated_in_place_and_shown_once_as_it_ended() -> None:
    """A Keras or tqdm bar: each redraw of the line not ended yet goes to `update` (a terminal shows it in place);
    the line, once ended, is shown once as its last state, not as every redraw run together."""
    import queue

    from tflab.run.watch import ProcessWatch

    shown, updates = [], []
    watch = ProcessWatch("worker0", "run:t:worker0", FakeExecutor({}), queue.SimpleQueue(), lambda: 0.0,
                         show=shown.append, update=updates.append)
    watch.output(b"Epoch 1/1\n\r 1/3 [....]", False)
    watch.output(b" - ETA: 4s\r 2/3 [==..] - ETA: 2s", False)
    watch.output(b"\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\b\r 3/3 [====] - 1s 5ms/step\n", False)
    assert updates == [" 1/3 [....]", " 2/3 [==..] - ETA: 2s"], "each chunk: the state a terminal shows"
    assert shown == ["Epoch 1/1", " 3/3 [====] - 1s 5ms/step"]
