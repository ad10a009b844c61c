"""Direct tests of small modules with logic of their own (issue 36): fan-out, signals, keys, strict YAML, a node's
run record and the verdict sentences. Expectations are literals, not the code's own formulas."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest

from tflab.errors import UserError
from tflab.host import fanout, keys, signals
from tflab.plan import strictyaml
from tflab.run import verdicts
from tflab.run.events import Exited, Finish
from tflab.run.noderun import NodeRun


def test_parallel_calls_every_item_at_once_and_keeps_their_order() -> None:
    started: list[float] = []

    def slow(x: int) -> int:
        started.append(time.monotonic())
        time.sleep(0.2)
        return x * 10

    began = time.monotonic()
    assert fanout.parallel(slow, [3, 1, 2]) == [30, 10, 20]
    assert time.monotonic() - began < 0.5, "three 0.2 s calls ran side by side"


def test_parallel_raises_one_error_as_itself_and_several_naming_each_item() -> None:
    def boom(x: int) -> int:
        if x > 1:
            raise UserError(f"bad {x}")
        return x

    with pytest.raises(UserError, match="^bad 2$"):
        fanout.parallel(boom, [1, 2])
    with pytest.raises(fanout.FanOutError) as caught:
        fanout.parallel(boom, [1, 2, 3])
    assert str(caught.value) == "2: bad 2; 3: bad 3" and caught.value.exit_code == 2
    outcomes = fanout.each(boom, [1, 2])
    assert outcomes[0].value == 1 and isinstance(outcomes[1].error, UserError)


def test_parallel_holds_to_its_limit() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def work(_x: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    fanout.parallel(work, range(8), limit=2)
    assert most[0] == 2


def test_merged_streams_give_every_item_with_its_name() -> None:
    got = sorted(fanout.merged({"a": iter([1, 2]), "b": iter([3])}))
    assert got == [("a", 1), ("a", 2), ("b", 3)]


def test_a_second_signal_forces_and_the_old_handlers_come_back() -> None:
    said: list[tuple[str, bool]] = []
    before = signal.getsignal(signal.SIGUSR1)
    with signals.stop_signals(lambda reason, force: said.append((reason, force))):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
    assert said == [("stopped (SIGTERM)", False), ("stopped by `tflab stop`", True)]
    assert signal.getsignal(signal.SIGUSR1) == before


@pytest.mark.parametrize(("signum", "reason"), [(signal.SIGTERM, "stopped (SIGTERM)"),
                                                (signal.SIGHUP, "the terminal closed (SIGHUP)")])
def test_a_build_told_to_stop_unwinds_as_at_a_ctrl_c(signum: int, reason: str) -> None:
    """SIGTERM's own end runs no `finally` (a killed `tflab base` left its container and tree): inside, it raises."""
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(KeyboardInterrupt, match=re.escape(reason)):
        with signals.stopping_as_interrupted():
            try:
                os.kill(os.getpid(), signum)
                time.sleep(5)
            finally:
                cleaned.append(True)
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_new_key_pair_is_openssh_ed25519_with_its_comment() -> None:
    pair = keys.new_key_pair("tflab lab t1")
    assert pair.private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    kind, body, comment = pair.public.rstrip("\n").split(" ", 2)
    assert (kind, comment) == ("ssh-ed25519", "tflab lab t1") and len(body) == 68
    assert keys.new_key_pair("x").public != pair.public


def test_strict_yaml_names_a_key_given_twice_with_its_lines() -> None:
    with pytest.raises(UserError, match=r"^tflab.yaml: the key 'nodes' is given twice \(lines 2 and 3\): keep one$"):
        strictyaml.load_yaml("topology:\n  nodes: 2\n  nodes: 3\n", "tflab.yaml")
    with pytest.raises(UserError, match=r"^tflab.yaml is not valid YAML: "):
        strictyaml.load_yaml("a: [", "tflab.yaml")
    assert strictyaml.load_yaml("a: {b: 1}\n", "x") == {"a": {"b": 1}}
    assert strictyaml.shown(True) == "bool True" and strictyaml.shown([1]) == "a list" and strictyaml.shown(None) == "null"


class _Part(strictyaml.Keys):
    nodes: int = 1
    place: dict[str, strictyaml.Text] | None = {}


class _File(strictyaml.Keys):
    topology: _Part | None = None
    gpus: list[_Part] = []


@pytest.mark.parametrize(("doc", "said"), [
    ({"topology": {"nodse": 1}}, "tflab.yaml: topology.nodse is not a key tflab knows (did you mean nodes?); "
                                 "the keys here are: nodes, place"),
    ({"topolgy": {}}, "tflab.yaml: topolgy is not a key tflab knows (did you mean topology?)"),
    ({"topology": {"nodes": "2"}}, "tflab.yaml: topology.nodes must be a whole number, not str '2'"),
    ({"gpus": [{}, {"nodes": None}]}, "tflab.yaml: gpus[1].nodes must be a whole number, not null"),
    ({"gpus": [{}, 3]}, "tflab.yaml: gpus[1] must be a mapping, not int 3"),
    ({"topology": {"place": {"ps0": " "}}}, "tflab.yaml: topology.place.ps0 must be a text, not str ' '"),
    ({"topology": {"place": {1: "a"}}}, "tflab.yaml: topology.place has a key that is not a word: 1"),
    ({"topology": [1]}, "tflab.yaml: topology must be a mapping, not a list"),
])
def test_a_declared_model_says_what_is_wrong_in_one_line_naming_the_key(doc: dict, said: str) -> None:
    """pydantic reads the document; tflab says the first thing it found, in its words, at pydantic's place."""
    with pytest.raises(UserError) as refused:
        strictyaml.read_as(_File, doc, "tflab.yaml")
    assert str(refused.value).startswith(said)
    assert strictyaml.read_as(_File, {"topology": None, "gpus": [{"place": None}]}, "x") == _File(gpus=[_Part()])


def test_a_nodes_rate_duration_and_last_signs_of_life() -> None:
    node = NodeRun("worker0", "worker", started=10.0)
    assert node.running and not node.progressed and node.duration == 0.0
    node.steps += [(11.0, 0), (13.0, 100), (15.0, 200)]
    node.last_output = 16.0
    assert node.progressed and node.last_progress == 15.0 and node.last_active == 16.0
    assert node.rate() == pytest.approx(50.0)
    node.ended = 17.5
    assert not node.running and node.duration == 7.5


def test_the_sentences_a_verdict_says() -> None:
    assert verdicts.how_it_ended(Exited("w", 3, 1.0)) == "exited with 3"
    # the guard's word, said in its one sentence where the event is made from the connection's End, for every
    # sentence that tells of the end: a server's, a worker's failure, run.json's `said`
    from tflab_guard.protocol import Ending

    from tflab.engine.attached import End
    from tflab.run.watch import exited_event
    killed = exited_event("w", 1.0, End(137, None, Ending(137, "SIGKILL", "outside")))
    assert (killed.reason, killed.signal, killed.ended_by) == ("killed by SIGKILL from outside tflab", "SIGKILL",
                                                               "outside")
    assert verdicts.how_it_ended(killed) == "exited with 137 (killed by SIGKILL from outside tflab)"
    assert verdicts.how_it_ended(exited_event("w", 1.0, End(143, "its container stopped",
                                                            Ending(143, "SIGTERM", "outside")))) == \
        "exited with 143 (killed by SIGTERM from outside tflab; its container stopped)"
    assert verdicts.how_it_ended(exited_event("w", 1.0, End(3, None, Ending(3)))) == "exited with 3"
    from tflab.run.events import Began
    from tflab.run.machine import RunMachine
    from tflab.run.runplan import RunPlan
    machine = RunMachine(RunPlan(servers=(), finishers=("worker0", "w"), chief="worker0"))
    machine.handle(Began(0.0))
    assert machine.handle(killed)[-1] == Finish(1, "failed", "w failed with exit code 137 (killed by SIGKILL from "
                                                             "outside tflab)")
    assert verdicts.how_it_ended(Exited("w", None, 1.0, "its container is gone")) == \
        "ended with no exit code: its container is gone"
    node = NodeRun("worker1", "worker", verdict="failed", exit_code=None, reason="lost")
    assert verdicts.node_verdict(Finish(1, "failed", None), node) == \
        Finish(255, "failed", "worker1 ended with no exit code: lost")
    assert verdicts.node_verdict(Finish(130, "interrupted", "x"), node) == Finish(130, "interrupted", "x")
    oom = NodeRun("worker1", "worker", verdict="oom", exit_code=None)
    assert verdicts.node_verdict(Finish(1, "oom", "p"), oom) == Finish(137, "oom", "p")


def test_every_verdict_is_declared_once_and_has_its_colour() -> None:
    from tflab_guard import protocol

    from tflab.cli import views
    from tflab.run.words import Verdict

    assert set(views.VERDICT_COLOURS) == set(Verdict), "the summary's colours cover every verdict"
    assert views.verdict_colour("served") == "green" and views.verdict_colour("-") == "yellow"
    assert Verdict("ok") == "ok" and f"{Verdict.SHUT_DOWN}" == "shut down", "a verdict is its word (run.json)"
    # run.json's reasons: one of a declared set, from the guard's words
    assert set(protocol.RECORD_REASONS.values()) == {"oom", "stopped", "lease", "outside"}


def test_the_summary_and_tflab_runs_say_the_signal_that_ended_a_node() -> None:
    from rich.console import Console

    from tflab.cli import views
    from tflab.plan.topology import Topology, plan
    from tflab.run.runreport import NodeRow, RunReport

    rows = {"ps0": NodeRow("server", 1, 143, "stopped", "stopped", "SIGTERM", "stopped by tflab with SIGTERM"),
            "worker0": NodeRow("finisher", 1, 0, "ok"),
            "worker1": NodeRow("finisher", 1, 137, "failed", "outside", "SIGKILL", "killed by SIGKILL from outside tflab"),
            "worker2": NodeRow("finisher", 1, 139, "failed", None, "SIGSEGV", "crashed with SIGSEGV")}
    report = RunReport(task="train", state="finished", verdict="failed", nodes=rows,
                       quality={"accuracy": 0.97221, "loss": 0.0012})
    assert views.ending_text(report) == " (worker1 SIGKILL from outside tflab, worker2 SIGSEGV)"
    assert views.quality_text(report) == "accuracy 0.9722, loss 0.0012"
    console = Console(width=120, record=True)
    console.print(views.run_summary(plan(Topology(nodes=4), []), rows))
    table = console.export_text()
    assert [line.split("│")[3].strip() for line in table.splitlines() if line.startswith("│ ")] == \
        ["SIGTERM", "0", "137 SIGKILL", "139 SIGSEGV"]
    console = Console(width=250, record=True)
    console.print(views.runs_table([("train", report)]))
    assert "failed (worker1 SIGKILL from outside tflab, worker2 SIGSEGV)" in " ".join(console.export_text().split())


def test_tflab_runs_keeps_the_verdict_whole_in_a_narrow_terminal() -> None:
    """CI found it: a quality column squeezed `interrupted` to `interr…` in an 80-column table."""
    from rich.console import Console

    from tflab.cli import views
    from tflab.run.runreport import RunReport

    found = [("train", RunReport(task="train", state="finished", verdict="ok", result="worker0: test accuracy 0.9722",
                                 steps_per_s=191.6, quality={"loss": 0.0008, "accuracy": 0.9722}, started=1.8e9)),
             ("long", RunReport(task="long", state="finished", verdict="interrupted", started=1.8e9,
                                result="worker0: starting fresh in /runs/long"))]
    console = Console(width=80, record=True)
    console.print(views.runs_table(found))
    text = console.export_text()
    assert "interrupted" in text and "accuracy" in text and "loss" not in text, text
    # A long last line squeezed it again (found this session): the column keeps its longest word whole.
    found = [("train", RunReport(task="train", state="finished", verdict="ok", started=1.8e9, duration_s=21.3,
                                 result="worker0: test accuracy 0.9806", steps_per_s=148.9,
                                 limit={"kind": "worker-cpu"})),
             ("long", RunReport(task="long", state="finished", verdict="interrupted", started=1.8e9, duration_s=6.6,
                                result="data: digits, 1437 training and 360 test examples of 64 features",
                                limit={"kind": "none"}))]
    console = Console(width=80, record=True)
    console.print(views.runs_table(found))
    assert "interrupted" in console.export_text(), console.export_text()
    assert views.result_text(RunReport(task="t", state="finished", result="worker0: done",
                                       quality={"loss": 0.5})) == "worker0: done [loss 0.5]"


def test_tflab_runs_is_one_line_a_run_with_the_names_whole_in_80_and_120_columns() -> None:
    """issue 63.11: `runs` wrapped a run into 4-9 lines and cut a moved-aside run's name in 80-120 columns."""
    from rich.console import Console

    from tflab.cli import views
    from tflab.run.runreport import RunReport

    found = [("train", RunReport(task="train", state="finished", verdict="ok", started=1.8e9, duration_s=100.0,
                                 result="worker0: test accuracy 0.9712 after 2000 global steps", steps_per_s=12.3,
                                 limit={"kind": "worker-cpu"})),
             ("allreduce.20261207-101010", RunReport(
                 task="allreduce", state="finished", verdict="interrupted", started=1.8e9, duration_s=9.5,
                 result="keras3-per-replica: ValueError: Attempt to convert a value (PerReplica:{", steps_per_s=None,
                 limit={"kind": "worker-cpu"}))]
    for width in (80, 120):
        console = Console(width=width, record=True)
        console.print(views.runs_table(found))
        lines = [line.rstrip() for line in console.export_text().splitlines() if line.strip()]
        rows = [line for line in lines if line.startswith(("train ", "allreduce.20261207-101010 "))]
        assert len(rows) == 2 and all("worker-cpu" in r for r in rows), lines
        assert "interrupted" in rows[1] and max(len(line) for line in lines) <= width, lines
        if width == 80:  # the results follow, a line each
            assert "train: worker0: test accuracy 0.9712 after 2000 global steps" in lines, lines
            assert lines[-1].startswith("allreduce.20261207-101010: keras3-per-replica: ValueError") and \
                lines[-1].endswith("…"), lines
        else:
            assert "worker0: test accuracy 0.9712" in rows[0], rows


def test_a_runs_knobs_stay_whole_below_the_table_where_the_terminal_is_narrow() -> None:
    """A sweep's knobs wrapped into six lines of ten columns in 80: they go below the table with the result."""
    from rich.console import Console

    from tflab.cli import views
    from tflab.run.runreport import RunReport

    found = [("wait", RunReport(task="wait", state="finished", verdict="ok", started=1.8e9, duration_s=20.0,
                                result="worker0: done", limit={"kind": "link"},
                                knobs={"workers": 2, "link_rate": "20mbit", "cpus": {"worker0": 0.3}}))]
    narrow = Console(width=80, record=True)
    narrow.print(views.runs_table(found))
    lines = [line.rstrip() for line in narrow.export_text().splitlines() if line.strip()]
    assert lines[1].startswith("wait ") and lines[1].split()[-4:] == ["20.0s", "ok", "-", "link"], lines
    assert len(lines) == 3 and lines[2] == "wait: workers 2, link 20mbit, cpus worker0=0.3; worker0: done", lines
    wide = Console(width=200, record=True)
    wide.print(views.runs_table(found))
    rows = [line for line in wide.export_text().splitlines() if line.startswith("wait ")]
    assert len(rows) == 1 and "workers 2, link 20mbit, cpus worker0=0.3" in rows[0] and "worker0: done" in rows[0]
