"""A corpus of bad and odd inputs (issue 30): every one a sentence naming the value, a non-zero exit, no traceback,
no "internal error", nothing written and nothing started. No engine is needed: asking it fails the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cli, snapshot

from tflab.engine import daemon

GEN = [  # (gen's arguments, a piece of the value the sentence must name)
    (["--nodes", "0"], "0"), (["--nodes", "-3"], "-3"), (["--nodes", "5000"], "5000"), (["--nodes", "x"], "x"),
    (["--nodes", "\u00b2"], "\u00b2"), (["--ps", "-1"], "-1"), (["--ps", "4"], "4"),
    (["--gpus-per-node", "-2"], "-2"), (["--gpus", "0-3x", "--gpus-per-node", "1"], "0-3x"),
    (["--gpus", "3-1", "--gpus-per-node", "1"], "3-1"), (["--gpus", "0,0", "--gpus-per-node", "1"], "0,0"),
    (["--gpus", "0-2999999", "--gpus-per-node", "1"], "2999999"), (["--gpus", "", "--gpus-per-node", "1"], "''"),
    (["--gpus", "\u0661", "--gpus-per-node", "1"], "\u0661"),
    (["--cpus-per-node", "0.001"], "0.001"), (["--cpus-per-node", "-1"], "-1"), (["--cpus-per-node", "nan"], "nan"),
    (["--cpus-per-node", "inf"], "inf"), (["--cpus-per-node", "lots"], "lots"), (["--cpus-per-node", "1e9"], "1e9"),
    (["--cpus-per-node", "64"], "64"),
    (["--memory-per-node", "1000"], "1000"), (["--memory-per-node", "100k"], "100k"),
    (["--memory-per-node", "32m"], "32m"), (["--memory-per-node", "4q"], "4q"),
    (["--memory-per-node", "-4g"], "-4g"), (["--memory-per-node", "99999t"], "99999t"),
    (["--memory-per-node", "\u00b2g"], "\u00b2g"), (["--memory-per-node", "4 g b"], "4 g b"),
    (["--ssh-port-base", "65534"], "65537"), (["--ssh-port-base", "0"], "0"),
    (["--tensorboard-port-base", "70000"], "70000"), (["--ssh-port-base", "-5"], "-5"),
    (["--bind", "1.2.3.999"], "1.2.3.999"), (["--bind", "localhost x"], "localhost x"), (["--bind", ""], "''"),
    (["--bind", "::1x"], "::1x"),
    (["--base", "python:3.11\nRUN x"], "RUN x"), (["--base", "Tensorflow/TF"], "Tensorflow/TF"),
    (["--base", "a b"], "a b"), (["--base", ""], "''"),
    (["--code", "/no/such/folder"], "/no/such/folder"), (["--data", "/no/such/folder"], "/no/such/folder"),
    (["--code", "/"], "/"), (["--data", "/etc"], "/etc"), (["--runs", "/"], "/"), (["--runs", "/usr"], "/usr"),
    (["--data-mode", "rsync"], "rsync"), (["--target", "k8s"], "k8s"), (["--target", "swarm"], "127.0.0.1"),
    (["--target", "swarm", "--bind", "10.0.0.1"], "10.0.0.1"),
    (["--link-rate", "fast"], "fast"), (["--link-rate", "0"], "0"), (["--link-rate", "0mbit"], "0mbit"),
    (["--link-rate", "99999999999tbit"], "99999999999tbit"), (["--link-rate", "-5mbit"], "-5mbit"),
    (["--link-delay", "-1"], "-1"), (["--link-delay", "soon"], "soon"), (["--link-delay", "99999999"], "99999999"),
    (["--link-delay", "1e-9"], "1e-9"), (["--shm-size", "lots"], "lots"), (["--shm-size", "2 gigs"], "2 gigs"),
    (["--place", "ps0=a"], "--place"), (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps9=a"], "ps9"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0"], "ps0"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0=# b"], "# b"),
    (["--target", "swarm", "--bind", "0.0.0.0", "--place", "ps0=gpu: a"], "gpu: a"),
    (["--name", "lab\n# injected"], "injected"), (["--name", "x" * 101], "x" * 101),
    (["--pip", "pandas\nRUN x"], "RUN x"), (["--pip", "--index-url=http://evil"], "--index-url=http://evil"),
    (["--pip", "-r ../../etc/passwd"], "../../etc/passwd"), (["--pip", "-r missing.txt"], "missing.txt"),
    (["--pip", ""], "''"), (["--apt", "Foo Bar"], "Foo Bar"), (["--apt", "jq;rm"], "jq;rm"), (["--apt", ""], "''"),
    (["--tensorflow", "latest"], "latest"), (["--tensorflow", "2"], "'2'"), (["--tensorflow", "2.15.0\n"], "2.15.0"),
    (["--share-gpus", "--gpus-per-node", "-1"], "-1"),
]

LAB_FILES = [  # (tflab.yaml's text, a piece of the value the sentence must name)
    ("", "is empty"), ("# a comment\n", "is empty"), ("- a list", "mapping"), ("a: [", "not valid YAML"),
    ("topology: [1, 2]", "list"), ("topology: {nodes: four}", "four"), ("topology: {nodes: 2.5}", "2.5"),
    ("topology: {nodes: -1}", "-1"), ("topology: {nodes: 999999}", "999999"), ("topology: {nodes: true}", "True"),
    ("topology: {ps: -2}", "-2"), ("topology: {chief: 'false'}", "false"), ("topology: {nodse: 4}", "nodse"),
    ("toplogy: {nodes: 4}", "toplogy"), ("topology: {nodes: 2}\ntopology: {nodes: 3}\n", "topology"),
    ("ports: {ssh_base: 70000}", "70000"), ("ports: {ssh_base: '20022'}", "20022"), ("ports: {bind: 127}", "127"),
    ("ports: {bind: 'no.such.address'}", "no.such.address"), ("image: {memlock: lots}", "lots"), ("shm_size: lots", "lots"),
    ("image: {memlock: -5}", "-5"), ("image: {base: ''}", "image.base"), ("image: {base: 'a b'}", "a b"),
    ("image: {tensorflow: 2.15}", "2.15"), ("image: {tensorflow: 'two'}", "two"), ("image: {shm: 2g}", "shm"),
    ("gpus: {index: 0}", "gpus"), ("gpus: [{index: -1}]", "-1"), ("gpus: [{name: x}]", "index"),
    ("links: {rate: fast}", "fast"), ("links: {delay_ms: -1}", "-1"), ("links: {delay_ms: soon}", "soon"),
    ("links: {rate: 99999999999tbit}", "99999999999tbit"),
    ("data_mode: rsync", "rsync"), ("target: kubernetes", "kubernetes"), ("code: 3", "3"),
    ("code: ../../../../../../../../etc", "/etc"), ("runs: /", "/"), ("data: /usr/lib", "/usr/lib"),
    ("name: \"a\\nb\"", "a\\nb"), ("packages: {pip: pandas}", "pandas"), ('packages: {pip: ["a\\nb"]}', "a\\nb"),
    ("packages: {apt: ['Foo Bar']}", "Foo Bar"), ("packages: {npm: [x]}", "npm"),
    ("tasks: [train]", "list"), ("tasks: {train: 3}", "train"), ("tasks: {train: ''}", "train"),
    ("tasks:\n  t: echo a\n  t: echo b\n", "'t'"), ("tasks: {'a/b': echo}", "a/b"), ("tasks: {'..': echo}", ".."),
    ('tasks: {"t\\n": echo}', "t\\n"), ("tasks: {1: echo}", "1"), ("tasks: {t: {cmd: x}}", "cmd"),
    ("tasks: {t: {command: x, servers: [boss]}}", "servers"), ("tasks: {t: {command: x, progress: '('}}", "progress"),
    ("swarm: {place: {ps0: 5}}", "5"), ("swarm: {place: {ps0: '# b'}}", "# b"), ("warm: maybe", "maybe"),
]

COMMANDS = [  # (a command on a lab of ps0 and worker0, a piece of the value the sentence must name)
    (["run", "nope"], "nope"), (["run", "../x"], "../x"), (["run", "train", "--grace", "-1"], "--grace"),
    (["run", "train", "--grace", "nan"], "--grace"), (["run", "train", "--timeout", "0"], "--timeout"),
    (["run", "train", "--restarts", "-1"], "--restarts"), (["run", "train", "--via", "telnet"], "telnet"),
    (["run", "train", "--fault", "explode ps0"], "explode ps0"), (["run", "train", "--fault", "kill ps9 at 5s"], "ps9"),
    (["run", "train", "--fault", "kill worker0 at step -5"], "-5"),
    (["run", "train", "--fault", "kill worker0 at soon"], "soon"),
    (["run", "train", "--fault", "cpu worker0 0.000001 at 5s"], "1e-06"),
    (["run", "train", "--fault", "cpu worker0 inf at 5s"], "inf"),
    (["run", "train", "--fault", "slow ps0 fast at 5s"], "fast"), (["run", "train", "--expect", "win"], "win"),
    # run-time knobs (the lab: ps0 and worker0, no NET_ADMIN)
    (["run", "train", "--workers", "2"], "--workers 2"), (["run", "train", "--workers", "0"], "--workers 0"),
    (["run", "train", "--workers", "x"], "'x'"), (["run", "train", "--workers", "-1"], "'-1'"),
    (["run", "train", "--workers", "\u0663"], "--workers"), (["run", "train", "--link-rate", "fast"], "fast"),
    (["run", "train", "--link-rate", "1tbit"], "1tbit"), (["run", "train", "--link-rate", "100mbit"], "NET_ADMIN"),
    (["run", "train", "--cpus", "0"], "'0'"), (["run", "train", "--cpus", "nan"], "nan"),
    (["run", "train", "--cpus", "worker9=0.5"], "worker9"), (["run", "train", "--cpus", "worker0=lots"], "lots"),
    (["run", "train", "--cpus", "99999"], "99999"), (["run", "train", "--cpus", "-1"], "'-1'"),
    (["run", "train", "--env", "BATCH"], "BATCH"), (["run", "train", "--env", "1X=2"], "1X=2"),
    (["run", "train", "--env", "TF_CONFIG={}"], "TF_CONFIG"), (["run", "train", "--env", "TFLAB_NODE=x"], "TFLAB_NODE"),
    (["run", "train", "--env", "node=x"], "{node}"), (["run", "train", "--fault", "kill ps0 at 5s", "--workers", "1",
                                                        "--cpus", "ps0=0"], "'0'"),
    (["exec", "worker9", "train"], "worker9"), (["exec", "worker0", "nope"], "nope"),
    (["exec", "worker0", "--grace", "-3", "train"], "-3"), (["exec", "worker0", "--via", "telnet", "train"], "telnet"),
    (["exec", "worker0", "train", "extra"], "extra"),
    (["fault", "kill", "worker9"], "worker9"), (["fault", "cpu", "worker0", "0"], "0"),
    (["fault", "cpu", "worker0", "nan"], "nan"), (["fault", "slow", "ps0", "fast"], "fast"),
    (["fault", "pause", "worker9"], "worker9"),
    (["render", "k8s", "--image", "x:1", "--kind", "deployment"], "deployment"),
    (["render", "k8s", "--image", "x:1", "--namespace", "Team-A"], "Team-A"),
    (["render", "k8s", "--image", "x:1", "--namespace", "a_b"], "a_b"),
    (["render", "k8s", "--image", "x:1", "--task", "nope"], "nope"),
    (["render", "k8s", "--image", "x:1", "--runs-claim", "Bad_Claim"], "Bad_Claim"), (["render", "k8s"], "--image"),
    (["top", "--interval", "nan"], "nan"), (["top", "--interval", "0.01"], "0.01"),
    (["logs", "--tail", "ten"], "ten"), (["logs", "--tail", "\u00b2"], "\u00b2"),
    (["attach", "nope"], "nope"), (["stop", "nope"], "nope"), (["attach", "../x"], "../x"),
    (["ssh", "worker9"], "worker9"),
]

RUNS_FILES = [  # (a run folder's run.json, a command that reads it)
    ('{"started": "x", "state": 5}', ["attach", "train"]), ("[1]", ["attach", "train"]),
    ("{not json", ["stop", "train"]), ('{"nodes": {"w": 5}}', ["attach", "train"]),
    ('{"started": 1e400}', ["stop", "train"]), ('{"pid": "me", "state": "running"}', ["stop", "train"]),
    ("", ["attach", "train"]), ('{"task": 7}', ["attach", "train"]),
]


class NoEngine(Exception):
    """Raised where a command asks the engine: a bad input must be refused before that."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    folder = tmp_path_factory.mktemp("corpus") / "lab"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tflab.host.ports.port_free", lambda host, port: True)
        result = CliRunner(mix_stderr=False).invoke(cli, ["gen", "--lab", str(folder), "--nodes", "2"])
    assert result.exit_code == 0, result.stderr
    return folder


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse():
        raise NoEngine("the engine was asked")

    monkeypatch.setattr(daemon, "client", refuse)
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    monkeypatch.setattr("tflab.host.buildsettings.read_apt_sources",
                        lambda: {"sources.list": "deb http://deb.debian.org/debian bookworm main\n"})


def refused(result, value: str) -> None:
    said = result.stderr + result.stdout
    assert result.exit_code not in (0, None), said
    assert "Traceback" not in said and "internal error" not in said and "NoEngine" not in said, said
    assert result.stderr.startswith("tflab: error: ") and len(result.stderr.strip().splitlines()) == 1, said
    assert value in result.stderr, (value, said)


def test_the_corpus_is_wide() -> None:
    assert len(GEN) + len(LAB_FILES) + len(COMMANDS) + len(RUNS_FILES) >= 150


@pytest.mark.parametrize(("args", "value"), GEN)
def test_gen(runner, tmp_path: Path, args: list[str], value: str) -> None:
    folder = tmp_path / "lab"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    before = snapshot(folder)
    refused(runner.invoke(cli, ["gen", "--lab", str(folder), *args]), value)
    assert snapshot(folder) == before


@pytest.mark.parametrize(("text", "value"), LAB_FILES)
def test_lab_file(runner, tmp_path: Path, text: str, value: str) -> None:
    (tmp_path / "tflab.yaml").write_text(text)
    before = snapshot(tmp_path)
    for command in (["status"], ["run", "train"], ["down"]):
        refused(runner.invoke(cli, [*command, "--lab", str(tmp_path)]), value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(("args", "value"), COMMANDS)
def test_command(runner, lab: Path, args: list[str], value: str) -> None:
    before = snapshot(lab)
    refused(runner.invoke(cli, [*args, "--lab", str(lab)]), value)
    assert snapshot(lab) == before


@pytest.mark.parametrize(("text", "command"), RUNS_FILES)
def test_runs_file(runner, tmp_path: Path, lab: Path, text: str, command: list[str]) -> None:
    folder = lab / "runs" / "train"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(text)
    try:
        before = snapshot(lab)
        refused(runner.invoke(cli, [*command, "--lab", str(lab)]), "train")
        listed = runner.invoke(cli, ["runs", "--lab", str(lab)])
        assert listed.exit_code == 0 and "Traceback" not in listed.stdout + listed.stderr, listed.stderr
        assert snapshot(lab) == before
    finally:
        (folder / "run.json").unlink()
    assert json.dumps(text)  # the text itself was written as given
