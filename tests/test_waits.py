"""Where a process waits, read from real py-spy dumps (tests/fixtures/stacks: each beside the program it was taken of,
TensorFlow 2.21 in tflab-base:cpu, py-spy 0.4.3 --full-filenames) as a cluster's expert reads them."""

from __future__ import annotations

import fakeguard
import pytest

from tflab.run.waits import Frame, WaitKind, threads, where_it_waits


def dump(name: str) -> str:
    return fakeguard.stack(name)[1]


def test_a_parameter_server_in_server_join_serves() -> None:
    wait = where_it_waits(dump("server_join"))
    assert wait.kind == WaitKind.SERVES
    assert wait.at == "Server.join (server_lib.py:185) ← <module> (ps.py:4)"
    assert wait.sentence("ps0") == "ps0 serves: it waits in TensorFlow's Server.join() (Server.join (server_lib.py:185) " \
                                   "← <module> (ps.py:4))"


def test_a_tf1_worker_waiting_for_its_chiefs_session_is_in_the_session_managers_wait() -> None:
    wait = where_it_waits(dump("tf1_session_wait"))
    assert wait.kind == WaitKind.SESSION
    assert wait.frames[0] == Frame("SessionManager.wait_for_session", "/opt/tensorflow/lib/python3.11/site-packages/"
                                   "tensorflow/python/training/session_manager.py", 457)
    assert wait.at.endswith("← … ← <module> (late.py:8)"), "the program's own frame, after TensorFlow's"


def test_a_program_asleep_in_its_own_retry_loop_is_its_own_wait() -> None:
    wait = where_it_waits(dump("own_retry_loop"))
    assert wait.kind == WaitKind.OWN
    assert wait.at == "with_retries.<locals>.wrap.<locals>.wrapped (retry.py:9) ← main (retry.py:19)"


def test_the_main_threads_wait_in_tensorflow_is_named_with_the_programs_frame() -> None:
    text = ('Process 12: python3 /workspace/train.py\nPython v3.11.2 (/usr/bin/python3.11)\n\n'
            'Thread 12 (idle): "MainThread"\n'
            '    all_reduce (/opt/tf/lib/python3.11/site-packages/tensorflow/python/ops/collective_ops.py:75)\n'
            '    _reduce (/opt/tf/lib/python3.11/site-packages/tensorflow/python/distribute/cross_device_ops.py:1140)\n'
            '    run (/opt/tf/lib/python3.11/site-packages/tensorflow/python/distribute/distribute_lib.py:1673)\n'
            '    train_step (/workspace/train.py:40)\n    <module> (/workspace/train.py:60)\n'
            'Thread 30 (idle): "Thread-1"\n    Thread.run (/usr/lib/python3.11/threading.py:982)\n')
    wait = where_it_waits(text)
    assert wait.kind == WaitKind.TENSORFLOW
    assert wait.at == "all_reduce (collective_ops.py:75) ← _reduce (cross_device_ops.py:1140) ← … ← train_step (train.py:40)"


def test_two_processes_one_after_another_and_nothing_readable() -> None:
    both = dump("own_retry_loop") + dump("server_join")
    assert [(t.pid, t.name) for t in threads(both)] == [(9, "MainThread"), (7, "MainThread")]
    assert where_it_waits(both).kind == WaitKind.SERVES, "a thread of the node's processes serves"
    for nothing in (None, "", "Error: Failed to find python version from target process\n"):
        assert where_it_waits(nothing).kind == WaitKind.UNKNOWN
        assert where_it_waits(nothing).sentence("worker1") == "worker1 waits; where could not be read"


@pytest.mark.parametrize("name", ["server_join", "tf1_session_wait", "own_retry_loop"])
def test_each_fixture_sits_beside_the_program_it_was_taken_of(name: str) -> None:
    program = (fakeguard.STACKS / f"{name}.py").read_text().splitlines()
    innermost_own = next(f for f in threads(dump(name))[0].frames if not f.in_library)
    assert program[innermost_own.line - 1].strip(), "the frame's line is a line of the program beside it"
