"""The one protocol between tflab and its guard (tflab_guard.protocol), both ways: every request the host builds
(engine/guardcmd) through the guard's own parser, and every reply the guard writes through the host's reader."""

from __future__ import annotations

import pytest
from tflab_guard import protocol
from tflab_guard.protocol import EndSplitter, Ending, StreamEnd

from tflab.engine import guardcmd

# Each request the host can build, and what the guard must read in it.
REQUESTS = {
    "run": (guardcmd.run_line("run:train:worker1", "python a.py --x=1", held=True, grace_s=2.5, start_id="2-ab12cd34"),
            dict(verb="run", key="run:train:worker1", wait_for_go=True, grace=2.5,
                 end_in_stream=True, shell="python a.py --x=1", argv=[], lease=None, id="2-ab12cd34")),
    "run words": (guardcmd.run_argv("exec:cmd:worker0:42", ["ls", "-l", "--", "x y"]),
                  dict(verb="run", key="exec:cmd:worker0:42", end_in_stream=True, shell=None,
                       argv=["ls", "-l", "--", "x y"], wait_for_go=False)),
    "attach": (guardcmd.attach("run:train:ps0", 10, 20), dict(verb="attach", key="run:train:ps0", out=10, err=20,
                                                               end_in_stream=True)),
    "serve": (guardcmd.serve("serve:train:ps0", "exec:train", "python ps.py", "/runs/train/logs/ps0.log"),
              dict(verb="serve", key="serve:train:ps0", lease="exec:train", log="/runs/train/logs/ps0.log",
                   shell="python ps.py")),
    "serve words": (guardcmd.serve_detached("tensorboard", ["tensorboard", "--logdir", "/runs"], "/runs/tb.log"),
                    dict(verb="serve", key="tensorboard", lease=None, argv=["tensorboard", "--logdir", "/runs"])),
    "hold": (guardcmd.hold("exec:train", "1234"), dict(verb="hold", lease="exec:train", holder="1234")),
    "holders": (guardcmd.has_holders("exec:train"), dict(verb="holders", lease="exec:train")),
    "probe": (guardcmd.probe("ps0", "run:train:ps0", 120.0, 15.0, while_busy=True, start_id="2-ab12cd34"),
              dict(verb="probe", address="ps0:2222", key="run:train:ps0", timeout=120.0, quiet=15.0, while_busy=True,
                   id="2-ab12cd34")),
    "alive": (guardcmd.alive("serve:train:ps0"), dict(verb="alive", key="serve:train:ps0")),
    "stack": (guardcmd.stack("run:train:worker1"), dict(verb="stack", key="run:train:worker1")),
    "ended": (guardcmd.ended("run:train:ps0"), dict(verb="ended", key="run:train:ps0")),
    "metrics": (guardcmd.metrics(2.0), dict(verb="metrics", every=2.0, count=0)),
    "stop": (guardcmd.stop(["run:train:*"], grace_s=1.5, force=True, forget=True),
             dict(verb="stop", patterns=["run:train:*"], grace=1.5, force=True, forget=True,
                  protocol=protocol.VERSION)),
}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_request_the_host_builds_is_read_by_the_guards_own_parser(name: str) -> None:
    argv, expected = REQUESTS[name]
    assert argv[:2] == protocol.GUARD
    args = protocol.parse(argv[2:])
    assert {field: getattr(args, field) for field in expected} == expected


def test_the_requests_cover_every_verb_of_the_guard() -> None:
    verbs = next(action for action in protocol.parser()._actions if action.dest == "verb").choices
    internal = {"version"}  # a person's
    assert {expected["verb"] for _argv, expected in REQUESTS.values()} == set(verbs) - internal


def test_a_misspelt_option_is_a_type_error_where_the_request_is_built() -> None:
    """Not the guard's usage at run time (exit 2), which tflab reads as an older guard's refusal ('run tflab up')."""
    with pytest.raises(TypeError, match="--wait-for-og"):
        protocol.Call("run", "run:t:w0", wait_for_og=True, shell="true").argv()
    with pytest.raises(TypeError, match="no verb"):
        protocol.Call("rnu", "run:t:w0").argv()


ENDINGS = [Ending(0), Ending(3), Ending(127, None, protocol.REFUSED), Ending(143, "SIGTERM", protocol.STOPPED),
           Ending(143, "SIGTERM", protocol.LAPSED), Ending(137, "SIGKILL", protocol.OOM),
           Ending(139, "SIGSEGV", protocol.CRASHED), Ending(137, "SIGKILL", protocol.OUTSIDE),
           Ending(255, None, protocol.LOST), Ending.never_ran(protocol.STOPPED), Ending.never_ran(protocol.LAPSED)]


@pytest.mark.parametrize("ending", ENDINGS, ids=repr)
def test_every_ending_the_guard_writes_is_read_back_the_same_and_said_in_one_sentence(ending: Ending) -> None:
    assert Ending.from_json(ending.to_json()) == ending  # the record (KEY.exit)
    assert Ending.from_answer(0, ending.to_json() + "\n") == ending  # `ended`'s answer
    splitter = EndSplitter()
    line = StreamEnd(ending, [12, 3]).line()
    own = b"".join(splitter.feed(line[i:i + 5]) for i in range(0, len(line), 5))  # cut anywhere on the way
    assert own == b"" and splitter.end is not None
    assert (splitter.end.ending, splitter.end.kept) == (ending, [12, 3])  # the end line
    assert ending.sentence() and ending.status() == (143 if ending.code is None else ending.code)


def test_an_ended_answer_without_an_ending_has_none() -> None:
    assert Ending.from_answer(1, "unknown\n") is None and Ending.from_answer(0, "") is None
    assert Ending.from_answer(2, "usage: tflab-guard ...") is None


def test_a_streams_own_bytes_pass_and_only_the_end_line_is_taken() -> None:
    splitter = EndSplitter()
    line = StreamEnd(Ending(0), [9, 0]).line()
    text = b"no newline"  # a program's last line may have none
    own = splitter.feed(text + line[:3]) + splitter.feed(line[3:] + b"after")
    assert own == text and splitter.end is not None and splitter.end.kept == [9, 0]
    plain = EndSplitter()
    assert plain.feed(b"a\0b") + plain.feed(b"\0") + plain.rest() == b"a\0b\0", "a NUL of its own is its own"


def test_the_replies_the_guard_writes_are_read_by_the_host() -> None:
    assert protocol.read_busy(protocol.busy_reply(12.34) + "\n") == 12.3  # a probe's `busy SECONDS`
    assert protocol.read_busy("") == 0.0
    assert protocol.HOLDING == "holding"  # a lease's holder's word once held (exec_session waits for it)


def test_a_metrics_line_the_guard_prints_is_the_sample_the_host_reads() -> None:
    """The metrics snapshot both ways: the guard's own `metrics` (here, on this host's cgroup) prints protocol.Sample
    lines; the host parses them to the same Sample and makes figures of two. A line that is not one is refused."""
    import subprocess
    import sys

    from tflab.engine.metrics import figures

    printed = subprocess.run([sys.executable, "-m", "tflab_guard", "metrics", "--count", "2", "--every", "0.3"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    before, now = (protocol.Sample.parse(line) for line in printed)
    assert before is not None and now is not None and now.t > before.t
    assert protocol.Sample.parse(now.line()) == now and now.line() == printed[1]
    found = figures("worker0", before, now, host_cpus=2)
    assert found.cpu_used is not None and found.cpu_used >= 0 and found.memory_mb and found.memory_mb > 0
    gpus = protocol.Sample(t=2.0, cpu_ns=3 * 10 ** 9, gpus=[[4, 50.0, 1000.0, 80000.0]])
    assert figures("w", protocol.Sample(t=1.0, cpu_ns=10 ** 9), gpus, host_cpus=8).gpus[0].util == 50.0
    for wrong in ('{"cpu_ns": 1}', '{"t": "now"}', '{"t": 1, "mem": "lots"}', '{"t": 1, "gpus": [[0, 1]]}', "[1]",
                  "Traceback (most recent call last):", '{"t": true}'):
        assert protocol.Sample.parse(wrong) is None, wrong
