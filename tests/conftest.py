"""Shared fixtures: the fake nvidia-smi, the engine probe, unique labs cleaned up by label."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import suite_base
import typer.main
from click.testing import CliRunner

from tflab.cli import app
from tflab.engine import daemon
from tflab.host.ports import port_free

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
# Tests that need the engine, compose v2 or Chromium fail when those are missing: only a
# developer who says so (TFLAB_TESTS_ALLOW_SKIP=1) gets skips instead.
ALLOW_SKIP = os.environ.get("TFLAB_TESTS_ALLOW_SKIP", "") not in ("", "0")
cli = typer.main.get_command(app)


def pytest_sessionstart(session: pytest.Session) -> None:
    """SIGTERM (CI's cancel, a timeout, scripts/test.sh stopping a lane) ends the session as Ctrl-C does.

    Python's own end on SIGTERM runs no teardown: every lab, swarm and cluster of the running tests
    would be left on the engine. As a KeyboardInterrupt, pytest tears their fixtures down first; a
    second signal (the terminal's Ctrl-C and the script's SIGTERM both reach a lane) is let pass, so
    it cannot cut that teardown short.
    A session started in the background (a lane of scripts/test.sh) inherits SIGINT ignored, and so
    would every `tflab` a test starts and then interrupts: SIGINT is made Python's own again.
    A test that runs tflab in this process may see the KeyboardInterrupt as tflab's own Ctrl-C (exit
    130): the session is told to stop after that test as well.
    """
    def interrupted(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.shouldstop = f"stopped by signal {signum}"
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)


# The waiting lane's tests that use about one core (workers that wait out TensorFlow's 30 s; a Slurm cluster's
# jobs, one CPU a node, seen ending by polling; a sweep of sleeping stand-ins; a wheel built and installed from an
# empty folder; the guard's own tests, which mostly wait, beside a lab's training) run first, beside the training
# lane, whose tests then get the other core. Last in that lane, after the training lane had ended, they left one
# core of two unused: the wheel's tests 54 s of a fresh clone's 594 s (1.05 cores busy); once they were first, the
# Slurm test's 51 s (0.97); then the guard's 43 s (0.71).
LIGHT_FIRST = ("test_docker_late_worker.py", "test_docker_signals.py", "test_docker_slurm.py", "test_docker_sweep.py",
               "test_wheel.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The waiting tests of LIGHT_FIRST's modules first, the rest in pytest's order (a stable sort: each module's
    tests as written)."""
    items.sort(key=lambda item: not (item.path.name in LIGHT_FIRST and item.get_closest_marker("waits")))


HOST_CPU = pytest.StashKey[float]()


def host_cpu_seconds() -> float:
    """CPU time the whole host has spent busy since boot (every core, every process: the engine's, the nodes'),
    from /proc/stat; 0.0 where there is none."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[HOST_CPU] = host_cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The host's CPU time over the test's setup, call and teardown, in its JUnit report (scripts/slowest.py
    prints it beside the time: a test that waits and one that computes read apart)."""
    if call.when == "teardown" and HOST_CPU in item.stash:
        item.user_properties.append(("host_cpu_s", f"{host_cpu_seconds() - item.stash[HOST_CPU]:.1f}"))
    yield


@contextmanager
def killed_after(child: subprocess.Popen, timeout: float) -> Iterator[None]:
    """While inside, `child` is killed once `timeout` seconds have passed: a read of its output that waits
    for a line it never prints ends (at its end of file) instead of blocking past any deadline. A child
    that leads its own session is killed with all of it (what it started holds the same pipe)."""
    def kill() -> None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            child.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def missing(what: str) -> None:
    """A test's requirement is missing: a failure, or a skip where the developer allowed skips."""
    if ALLOW_SKIP:
        pytest.skip(what)
    pytest.fail(f"{what} (set TFLAB_TESTS_ALLOW_SKIP=1 to skip such tests instead)")


@pytest.fixture(autouse=True)
def own_lab_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's gens keep their labs' ports in an index of their own (host.labindex), not in this user's: a lab of
    another test, or a developer's, would move the default ports a test expects."""
    from tflab.host import labindex

    path = tmp_path_factory.mktemp("labindex") / "labs.json"
    monkeypatch.setattr(labindex, "index_path", lambda: path)
    return path


@pytest.fixture
def runner() -> CliRunner:
    """Typer's CliRunner with stderr kept apart."""
    return CliRunner(mix_stderr=False)


@pytest.fixture
def fake_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put a fake nvidia-smi (eight H100s) first on PATH."""
    monkeypatch.setenv("PATH", f"{FIXTURES / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return FIXTURES / "bin" / "nvidia-smi"


@pytest.fixture
def no_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH on which there is no nvidia-smi at all."""
    keep = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))


def free_port_base(count: int, low: int = 40000, high: int = 60000) -> int:
    """A base such that `count` ports from it are free on loopback now."""
    for _ in range(200):
        base = random.randrange(low, high - count)
        if all(port_free("127.0.0.1", p) for p in range(base, base + count)):
            return base
    raise RuntimeError("no free port range found")


def node_image_of(built_stdout: str) -> str:
    """The node image's tag in what `tflab build` printed ('built tflab-node:…', or 'tflab-node:… is up to date')."""
    tags = [word for word in built_stdout.split() if word.startswith("tflab-node:")]
    assert tags, built_stdout
    return tags[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its content (to show a failed command wrote nothing)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def compose_argv() -> list[str]:
    """The compose v2 CLI; its absence fails the tests in CI (skip elsewhere)."""
    try:
        return daemon.find_compose()
    except Exception as exc:  # noqa: BLE001 - any failure to find compose is the same verdict
        missing(f"no compose v2: {exc}")


@pytest.fixture(scope="session")
def docker_client():
    """The engine; missing is a failure, not a skip."""
    try:
        client = daemon.client()
    except Exception as exc:  # noqa: BLE001
        missing(f"no Docker Engine: {exc}")
    if (os.environ.get("TFLAB_TESTS_SHARED_ENGINE", "") in ("", "0")
            and client.containers.list(all=True, filters={"label": "tflab.fixture=two-hosts"})):
        # An interrupted two-host walk left host b and its two-node swarm: every swarm test would
        # meet a swarm that needs a registry. The fixture's own `down` removes exactly what it made.
        # Not while another session shares this engine (scripts/test.sh's lanes): its walk may be running.
        subprocess.run([sys.executable, str(REPO / "scripts" / "two_hosts.py"), "down"],
                       capture_output=True, timeout=300)
    return client


@pytest.fixture(scope="session")
def base_build(docker_client, tmp_path_factory) -> dict:
    """The local base image (mmdebstrap + pip tensorflow-cpu), built once if missing, and what it was built with
    (suite_base.py): scripts/test.sh's build beside the unit tests, else this session's."""
    given = os.environ.get(suite_base.RECORD_ENV)
    facts = suite_base.recorded(Path(given)) if given else None
    if facts is None:
        try:
            facts = suite_base.build(tmp_path_factory.mktemp("base") / "base.json")
        except RuntimeError as exc:
            pytest.fail(str(exc))
    return facts


@pytest.fixture(scope="session")
def base_image(base_build) -> str:
    return base_build["tag"]


class LabFactory:
    """Makes labs with unique names, folders and ports; removes what they made, by label."""

    def __init__(self, root: Path, client) -> None:
        self.root = root
        self.client = client
        self.projects: list[str] = []

    def gen(self, *args: str, nodes: int = 4, name: str | None = None, code: Path | None = None,
            data: Path | None = None) -> Path:
        from tflab.host import labfiles

        lab = self.root / (name or f"lab-{uuid.uuid4().hex[:8]}")
        count = nodes + 2
        base = free_port_base(2 * count)  # one free range for both: two drawn apart may overlap, which gen refuses
        argv = [
            "gen", "--lab", str(lab), "--nodes", str(nodes),
            "--ssh-port-base", str(base), "--tensorboard-port-base", str(base + count),
            "--name", f"t{uuid.uuid4().hex[:10]}", *args,
        ]
        if code is not None:
            argv += ["--code", str(code)]
        if data is not None:
            argv += ["--data", str(data)]
        result = CliRunner(mix_stderr=False).invoke(cli, argv)
        assert result.exit_code == 0, result.stderr
        self.projects.append(labfiles.open_lab(lab).project)
        return lab

    def cleanup(self) -> None:
        from tflab.engine import compose_lab as lab_ops

        for project in self.projects:
            # Swarm labs are stacks: their services carry the label too (when this engine is a swarm).
            if self.client.info().get("Swarm", {}).get("ControlAvailable"):
                subprocess.run(["docker", "stack", "rm", project], capture_output=True)
                for _ in range(120):
                    if not self.client.containers.list(all=True, filters={"label": f"tflab.lab={project}"}, ignore_removed=True):
                        break
                    time.sleep(0.5)
            lab_ops.down(project, self.client)


@pytest.fixture
def labs(tmp_path: Path, docker_client, base_image) -> Iterator[LabFactory]:
    """A LabFactory whose labs are torn down (by label) after the test."""
    factory = LabFactory(tmp_path, docker_client)
    yield factory
    factory.cleanup()


@pytest.fixture(scope="module")
def module_labs(tmp_path_factory: pytest.TempPathFactory, docker_client, base_image) -> Iterator[LabFactory]:
    """A LabFactory whose labs serve every test of a module and are torn down (by label) after its last."""
    factory = LabFactory(tmp_path_factory.mktemp("labs"), docker_client)
    yield factory
    factory.cleanup()


# A task that trains until it is stopped.
LONG = ("python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} "
        "--worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=100000000")


def up_long_lab(factory: LabFactory) -> Path:
    """A running 3-node lab (ps0, worker0, worker1) with the examples and the task `long`."""
    import yaml

    lab = factory.gen(nodes=3)
    path = lab / "tflab.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["tasks"]["long"] = LONG
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    return lab


@pytest.fixture(scope="module")
def long_lab(module_labs) -> Path:
    """up_long_lab's lab, shared by a module's tests: each ends with no task process left in it (every test
    of it asserts so), as a user's next run finds a lab after a stopped, killed or interrupted one. Sharing
    it is that promise kept over the module, and it spares each test a lab of its own bring-up."""
    return up_long_lab(module_labs)


@pytest.fixture
def own_long_lab(labs) -> Path:
    """up_long_lab's lab for one test, for a test that leaves it changed (a stopped node)."""
    return up_long_lab(labs)
