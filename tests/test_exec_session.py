"""`tflab exec` sessions with a fake node: holds before looks, fresh or joined folders, workers watched like a run's."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import fakeguard
from tflab.run import history
from tflab.run.exec_session import ExecSession, ExecSetup
from tflab.run.history import ExecRecords
from tflab.run.runplan import RunPlan


class FakeProcess:
    """A node process: prints its lines, then exits with `code` after `delay` (or never); `close` stops it."""

    def __init__(self, lines, code, delay, on_output, on_exit) -> None:
        self.closed = threading.Event()
        self.ended = threading.Event()
        self.args = (lines, code, delay, on_output, on_exit)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        lines, code, delay, on_output, on_exit = self.args
        self.code = code
        try:
            for line in lines:
                on_output(f"{line}\n".encode(), False)
            if self.closed.wait(delay):
                self.code = 143
        finally:
            self.ended.set()
            on_exit(fakeguard.end(self.code, self.closed.is_set()))

    def release(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()

    def wait(self, timeout=None) -> bool:
        return self.ended.wait(timeout)


class FakeNodes:
    """Nodes whose guard answers as the real one: holders say `holding` (after `hold_delay`), servers serve."""

    def __init__(self, program: tuple[list[str], int | None, float], hold_delay: float = 0.0,
                 serving: set[str] | None = None, stack: str | None = "tf1_session_wait") -> None:
        self.program = program
        self.stack = stack  # the real dump (tests/fixtures/stacks) its program's stacks show, while it runs
        self.hold_delay = hold_delay
        self.serving = set(serving or ())
        self.calls: list[tuple[float, str, str]] = []  # (when, node, verb)
        self.holds: list[FakeProcess] = []
        self.lock = threading.Lock()

    def note(self, node: str, argv) -> str:
        verb = argv[2]
        with self.lock:
            self.calls.append((time.monotonic(), node, verb))
        return verb

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        if self.note(node, argv) == "hold":
            def holding() -> None:
                time.sleep(self.hold_delay)
                on_output(b"holding\n", False)
            threading.Thread(target=holding, daemon=True).start()
            process = FakeProcess([], 0, 3600, lambda *_: None, on_exit)
            self.holds.append(process)
            return process
        if argv[2] == "metrics":  # the node's CPU figures: none here (so nothing is called stalled)
            return FakeProcess([], None, 3600, lambda *_: None, lambda *_: None)
        self.node_process = FakeProcess(*self.program, on_output, on_exit)
        return self.node_process

    def run(self, node, argv, env=None, workdir="/"):
        verb = self.note(node, argv)
        if verb == "alive":
            return (0, "") if node in self.serving else (1, "")
        if verb == "holders":
            return (1, "")
        if verb == "ended":
            return fakeguard.ended(self.node_process.code, self.node_process.closed.is_set())
        if verb == "stack":
            running = hasattr(self, "node_process") and not self.node_process.ended.is_set()
            return fakeguard.stack(self.stack if running else None)
        return 0, ""

    def spawn(self, node, argv, env=None, workdir="/"):
        self.note(node, argv)
        self.serving.add(node)


def setup(tmp_path: Path, node: str = "worker1", servers=("ps0",), plan: RunPlan | None = None,
          resume: bool = False) -> ExecSetup:
    return ExecSetup(task="train", node=node, servers=servers,
                     commands={"ps0": "python ps.py", "worker0": "python w.py", "worker1": "python w.py"},
                     env={}, lock=tmp_path / "state" / "exec-train.lock", records=tmp_path / "state" / "execs" / "train",
                     runs_dir=tmp_path / "runs", plan=plan, resume=resume)


def session(tmp_path: Path, nodes: FakeNodes, **kw) -> tuple[ExecSession, list[str]]:
    said: list[str] = []
    return ExecSession(nodes, setup(tmp_path, **kw), lambda _chunk, _err: None, said.append), said


def test_an_exec_holds_the_servers_before_it_looks_at_them(tmp_path: Path) -> None:
    nodes = FakeNodes((["step 1"], 0, 0.1), hold_delay=0.5)
    result = session(tmp_path, nodes)[0].run()
    assert result.code == 0 and result.verdict == "ok"
    verbs = [verb for _, node, verb in nodes.calls if node == "ps0"]
    assert verbs[:3] == ["hold", "stop", "serve"]
    held_at = next(t for t, _, verb in nodes.calls if verb == "hold") + 0.5
    looked_at = next(t for t, node, verb in nodes.calls if node == "ps0" and verb in ("alive", "stop"))
    assert looked_at >= held_at - 0.05, "the lease is held (the guard said so) before the servers are looked at"


def test_the_first_exec_starts_fresh_and_the_next_one_joins(tmp_path: Path) -> None:
    old = tmp_path / "runs" / "train"
    old.mkdir(parents=True)
    (old / "model.ckpt-1500.index").write_text("a finished run")
    first = FakeNodes((["step 1"], 0, 1.5))
    one, said_one = session(tmp_path, first, node="worker0")
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(result=one.run()))
    thread.start()
    records = ExecRecords(tmp_path / "state" / "execs" / "train")
    deadline = time.monotonic() + 5
    while not records.live() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = FakeNodes((["step 1"], 0, 0.1), serving={"ps0"})
    joined = session(tmp_path, second)[0].run()
    thread.join(10)
    assert done["result"].fresh and not joined.fresh
    aside = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("train.")]
    assert len(aside) == 1, "only the first exec moved the earlier run aside"
    assert (tmp_path / "runs" / aside[0] / "model.ckpt-1500.index").exists()
    assert "serve" not in [verb for _, _, verb in second.calls], "the second exec joined the running ps0"
    assert any(line.startswith("train: a fresh session, outputs in ") for line in said_one)


def chief_finished(tmp_path: Path, code: int = 0) -> None:
    """The chief's exec, in another terminal, has ended."""
    records = ExecRecords(tmp_path / "state" / "execs" / "train")
    records.write("worker0", {"task": "train", "node": "worker0", "id": "other", "pid": 999999,
                              "started": time.time() - 5,
                              "ended": time.time(), "exit_code": code})


def worker_plan(stop_hung: bool) -> RunPlan:
    return RunPlan(servers=(), finishers=("worker1",), chief="worker0", grace_s=0.5, recovery_wait_s=0.5,
                   task_index={"worker1": 1}, stop_hung=stop_hung)


def test_a_worker_still_waiting_after_the_chiefs_exec_is_reported_and_with_grace_stopped(tmp_path: Path) -> None:
    nodes = FakeNodes((["waiting for the chief"], 0, 3600))
    worker, said = session(tmp_path, nodes, plan=worker_plan(stop_hung=True))
    threading.Timer(1.0, chief_finished, args=(tmp_path,)).start()
    started = time.monotonic()
    result = worker.run()
    assert time.monotonic() - started < 1.0 + 0.5 + 0.5 + 3, "reported within the grace and the recovery wait"
    assert (result.verdict, result.code) == ("hung", 1)
    assert result.problem.startswith("worker1 never printed a training step and still waited")
    assert 'device_filters=["/job:ps", "/job:worker/task:1"]' in result.problem
    assert "the chief (worker0) has finished" in said
    assert nodes.node_process.closed.is_set()


def test_without_grace_a_waiting_worker_is_only_reported_and_may_still_finish(tmp_path: Path) -> None:
    nodes = FakeNodes((["step 5"], 0, 3.0))
    worker, said = session(tmp_path, nodes, plan=worker_plan(stop_hung=False))
    threading.Timer(0.5, chief_finished, args=(tmp_path,)).start()
    result = worker.run()
    assert (result.verdict, result.code) == ("ok", 0), "a correct program is never called hung"
    looks_hung = [line for line in said if "it looks hung (Ctrl-C stops it; with --grace tflab stops it)" in line]
    assert len(looks_hung) == 1, said
    assert not nodes.node_process.closed.is_set()


def test_an_exec_keeps_a_record_and_its_node_log(tmp_path: Path) -> None:
    nodes = FakeNodes((["step 1", "done"], 3, 0.1))
    result = session(tmp_path, nodes, plan=worker_plan(stop_hung=True))[0].run()
    assert (result.verdict, result.code) == ("failed", 3)
    (record,) = ExecRecords(tmp_path / "state" / "execs" / "train").all()
    assert (record["node"], record["pid"], record["exit_code"], record["verdict"]) == ("worker1", os.getpid(), 3,
                                                                                       "failed")
    assert record["ended"] >= record["started"]
    assert (tmp_path / "runs" / "train" / history.LOG_DIR / "worker1.log").read_text() == "step 1\ndone\n"
    assert json.loads((tmp_path / "state" / "execs" / "train" / f"worker1-{record['id']}.json").read_text())


def test_a_failed_chief_exec_ends_a_waiting_workers_exec_at_once(tmp_path: Path) -> None:
    # issue 30.2: the worker's exec stayed silent for 97 s when the chief's exec failed
    nodes = FakeNodes((["waiting for the chief"], 0, 3600))
    worker, said = session(tmp_path, nodes, plan=worker_plan(stop_hung=False))
    threading.Timer(0.5, chief_finished, args=(tmp_path, 1)).start()
    started = time.monotonic()
    result = worker.run()
    assert time.monotonic() - started < 5
    assert result.verdict == "failed" and result.code != 0
    assert result.problem.startswith("the chief (worker0) exited with 1 in its own exec"), result.problem


class Frozen(FakeNodes):
    """A paused node: its process ignores the guard's stop, and killing it by force fails too."""

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        process = super().start(node, argv, on_output, on_exit, env, workdir)
        if argv[2] != "hold":
            process.close = lambda: None  # frozen: never ends
        return process

    def run(self, node, argv, env=None, workdir="/"):
        if argv[2] == "stop" and node == "worker1":
            from tflab.errors import EngineError

            raise EngineError("the engine refused: container is paused")
        return super().run(node, argv, env, workdir)


def test_a_second_ctrl_c_ends_the_exec_even_when_the_node_will_not_stop(tmp_path: Path, monkeypatch) -> None:
    # issue 30.2: a paused node kept `tflab exec` running 45 s after a double Ctrl-C, with a thread's traceback
    from tflab.run import exec_session

    monkeypatch.setattr(exec_session, "FORCE_WAIT_S", 1.0)
    nodes = Frozen((["step 1"], 0, 3600))
    worker, said = session(tmp_path, nodes, plan=worker_plan(stop_hung=False))
    threading.Timer(0.5, worker.interrupt, args=("interrupted", False)).start()
    threading.Timer(0.8, worker.interrupt, args=("interrupted", True)).start()
    errors: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    started = time.monotonic()
    result = worker.run()
    assert time.monotonic() - started < 5
    assert (result.verdict, result.code) == ("interrupted", 130)
    assert any("did not stop within 1s of the second Ctrl-C" in line for line in said), said
    assert any("could not kill worker1's train" in line for line in said), said
    assert errors == []


def test_an_exec_of_a_server_in_another_terminal_is_joined_not_started_twice(tmp_path: Path) -> None:
    # issue 30.3: `exec ps0 T`, then `exec worker0 T`: the second started a second ps0 ("Address already in use")
    ExecRecords(tmp_path / "state" / "execs" / "train").write("ps0", {
        "task": "train", "node": "ps0", "id": "other", "pid": os.getpid(), "started": time.time(), "ended": None})
    nodes = FakeNodes((["step 1"], 0, 0.1))
    result, said = session(tmp_path, nodes, node="worker0")
    assert result.run().verdict == "ok"
    ps0 = [verb for _, node, verb in nodes.calls if node == "ps0"]
    assert "serve" not in ps0 and "stop" not in ps0, ps0
    assert "ps0 is serving on ps0:2222 (its own exec, in another terminal: this exec joins it)" in said, said


def test_an_exec_of_a_server_that_already_serves_the_task_is_refused(tmp_path: Path) -> None:
    # the other order: `exec worker0 T` started ps0's server; `exec ps0 T` would start a second one
    import pytest

    from tflab.errors import UserError

    nodes = FakeNodes((["serving"], 0, 0.1), serving={"ps0"})
    ps0, _ = session(tmp_path, nodes, node="ps0", servers=())
    with pytest.raises(UserError, match="ps0 already serves train for the exec of another: a second one would find"):
        ps0.run()
    assert not [verb for _, node, verb in nodes.calls if verb in ("run", "serve")]


class IdleMetricsNodes(FakeNodes):
    """Nodes whose metrics say, as the real guard's `metrics` does (protocol.Sample lines), that the node computes
    nothing: a worker asleep, waiting for peers that never come."""

    def start(self, node, argv, on_output, on_exit, env=None, workdir="/workspace", renew=False, resume=None):
        if argv[2] != "metrics":
            return super().start(node, argv, on_output, on_exit, env, workdir, renew, resume)
        from tflab_guard.protocol import Sample

        process = FakeProcess([], None, 3600, lambda *_: None, lambda *_: None)

        def sample() -> None:
            while not process.closed.wait(0.1):
                on_output(Sample(t=time.time(), cpu_ns=10 ** 9, quota=0.5, mem=10 ** 8).line().encode() + b"\n", False)

        threading.Thread(target=sample, daemon=True).start()
        return process


def test_an_exec_waiting_in_silence_for_nodes_no_exec_runs_is_stalled_naming_them_and_the_command(tmp_path: Path) -> None:
    """`tflab exec worker1 train` alone: worker1 waits for worker0, which no exec runs; it prints nothing and computes
    nothing. The stall rule ends it, naming worker0 and the command that starts it."""
    nodes = IdleMetricsNodes(([], None, 3600), stack="own_retry_loop")
    plan = RunPlan(servers=(), finishers=("worker1",), chief="worker0", task_index={"worker1": 1}, stall_s=1.0)
    worker, said = session(tmp_path, nodes, plan=plan)
    result = worker.run()
    assert (result.verdict, result.code) == ("stalled", 1), (result, said)
    assert result.problem.endswith("worker0 runs no exec of train, and this one waits for it: `tflab exec worker0 "
                                   "train` in another terminal starts worker0, or `tflab run train` runs them all")
    assert any("worker1 waits in the program's own code" in line for line in said), said
