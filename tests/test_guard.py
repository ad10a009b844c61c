"""The in-node guard (guard.pyz, as nodes get it) run here: held starts, cold programs, stops, leases, probes.

Every test runs under this Python and under the oldest one the machine has (pyenv's 3.6, the
Python of TensorFlow 1.15's images) where it is installed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import missing

from tflab_guard import leases
from tflab_guard.protocol import Ending

from tflab.render.image_files import guard_zipapp

LEASE_S = 2.0  # the lease these tests give the guard (a node's is 10 s)
OLD_PYTHONS = [Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6"]


def old_python() -> Path | None:
    found = [p for p in OLD_PYTHONS if p.exists()]
    found += sorted(Path.home().glob(".pyenv/versions/3.6*/bin/python3.6"))
    return found[0] if found else None


@pytest.fixture(scope="session", params=["this", "3.6"])
def python(request) -> Path:
    """The interpreter the guard runs under in this test."""
    if request.param == "this":
        return Path(sys.executable)
    found = old_python()
    if found is None:
        missing("no Python 3.6 on this machine: README promises nodes on Python 3.6 (TensorFlow 1.15's images), so the "
                "guard runs under it here (`pyenv install 3.6.15`)")
    return found


@pytest.fixture(scope="session")
def zipapp(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("guard") / "guard.pyz"
    path.write_bytes(guard_zipapp())
    return path


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("TFLAB_GUARD_STATE", str(folder))
    yield folder


@pytest.fixture
def env(python: Path, state: Path) -> dict[str, str]:
    """The environment of a node whose `python` is the interpreter under test (and whose state folder is `state`)."""
    return {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "TFLAB_GUARD_STATE": str(state),
            "TFLAB_GUARD_LEASE_S": str(LEASE_S), "TFLAB_GUARD_HOST_LEASES": str(state.parent / "runs-leases")}


@pytest.fixture
def guard(python: Path, zipapp: Path, state: Path, env: dict[str, str]):
    """Start the guard with these arguments (stdin a pipe: tflab's connection)."""

    def start(*args: str, **kw) -> subprocess.Popen:
        kw.setdefault("env", env)
        return subprocess.Popen([str(python), str(zipapp), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=kw.pop("stderr", subprocess.STDOUT), universal_newlines=True, **kw)

    start.argv = [str(python), str(zipapp)]  # type: ignore[attr-defined]
    start.env = env  # type: ignore[attr-defined]
    return start


@pytest.fixture
def verb(python: Path, zipapp: Path, state: Path, env: dict[str, str]):
    """Run a guard verb to its end; its exit code."""

    def call(*args: str, **kw) -> int:
        kw.setdefault("env", env)
        return subprocess.run([str(python), str(zipapp), *args], stdin=subprocess.DEVNULL, timeout=60, **kw).returncode

    return call


@contextlib.contextmanager
def renewing(*children: subprocess.Popen):
    """tflab's renewals on these guards' connections while the block runs (it sends one a second; here every
    0.3 s): a guard that must outlive the tests' short lease is kept as tflab keeps it, however slow the host.

    Each renewal is one write of a whole line to the pipe, as the block's own words (`stop`, flushed) are: they
    never run into each other. The block does not close a renewed connection.
    """
    done = threading.Event()

    def renew() -> None:
        while not done.wait(0.3):
            for child in children:
                try:
                    os.write(child.stdin.fileno(), b"renew\n")
                except (OSError, ValueError):
                    pass  # that guard has ended: nothing to renew

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        yield
    finally:
        done.set()
        renewer.join()


def released(child: subprocess.Popen) -> str:
    """Send `go`, keep the connection open until the process ends by itself; its output."""
    child.stdin.write("go\n")
    child.stdin.flush()
    out = child.stdout.read()
    child.wait(timeout=10)
    child.stdin.close()
    return out


def ended(child: subprocess.Popen) -> str:
    """Its output, once it has ended by itself (the connection kept open until then)."""
    out = child.stdout.read()
    child.wait(timeout=10)
    child.stdin.close()
    return out


def _live_with(field: int, value: int) -> list[int]:
    """Live (not zombie) processes whose /proc stat field (after the name: 1 the parent, 2 the group) is `value`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[field]) == value and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (reaping orphans is up to the host's init)."""
    return _live_with(2, pgid)


def group_cpu_s(pgid: int) -> float:
    """The CPU seconds (user and system) the live processes of group `pgid` have used, as /proc says."""
    used = 0
    for pid in live_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return used / os.sysconf("SC_CLK_TCK")


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children_of(pid: int) -> list[int]:
    return _live_with(1, pid)


def ppid_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    """What `ps -ef` shows for `pid`."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()


def wait_for(check, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def fake_tensorflow(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """An environment whose `tensorflow` is a stub that notes when, and in which process, it is imported."""
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    stamp = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"import os\nIMPORTED_IN = os.getpid()\nopen({str(stamp)!r}, 'w').write('x')\n"
                                      "__version__ = 'fake'\n")
    return {**env, "PYTHONPATH": str(tmp_path / "site")}


def test_a_held_process_starts_on_go_and_passes_its_exit_code(guard, state: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    child = guard("run", "k:held", "--wait-for-go", "--shell", f"touch {marker}; echo done; exit 7")
    time.sleep(0.5)
    assert not marker.exists(), "a held process must not start before go"
    out = released(child)
    assert child.returncode == 7 and out == "done\n" and marker.exists()
    assert Ending.from_json((state / "k:held.exit").read_text()) == Ending(7, None, "exited")


def test_a_held_process_told_to_stop_before_go_never_runs(guard, state: Path, tmp_path: Path) -> None:
    """A `stop` wakes a held wait as `go` does; it must not release the program. (It did: the program was started
    and then stopped at once, and a `touch` got its file in about 12 of 20 tries here: five tries, not one.)"""
    for attempt in range(5):
        marker = tmp_path / f"ran-{attempt}"
        key = f"k:held-{attempt}"
        child = guard("run", key, "--wait-for-go", "--shell", f"touch {marker}")
        assert wait_for(lambda: (state / f"{key}.guard").exists())
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 143  # the guard exits as a shell's stopped process does
        child.stdin.close()
        never = Ending.from_json((state / f"{key}.exit").read_text())
        assert never == Ending(None, None, "stopped"), "recorded as never run, not as a signal it never got"
        assert never.sentence() == "never started: stopped by tflab while it was held"
        time.sleep(0.2)  # a started `touch` would have made its file by now
        assert not marker.exists(), f"try {attempt + 1}: a held program told to stop ran"


def test_a_line_that_sets_variables_runs_as_a_shell_would_run_it(guard) -> None:
    child = guard("run", "k:env", "--shell", "GREETING=hello TF_CPP_MIN_LOG_LEVEL=0 printenv GREETING TF_CPP_MIN_LOG_LEVEL")
    assert released(child) == "hello\n0\n" and child.returncode == 0


def test_a_missing_program_exits_127_with_a_sentence(guard, state: Path) -> None:
    child = guard("run", "k:typo", "--shell", "pyhton /workspace/train.py --x=1")
    out = released(child)
    assert child.returncode == 127
    assert out == "tflab: pyhton: command not found on the node's PATH (exit 127)\n"
    assert Ending.from_json((state / "k:typo.exit").read_text()) == Ending(127, None, "refused")
    child = guard("run", "k:path", "--shell", "/workspace/nowhere.sh")
    assert released(child) == "tflab: /workspace/nowhere.sh: no such file (exit 127)\n" and child.returncode == 127


def test_an_unbalanced_quote_and_the_shells_own_words_run_as_a_shell_runs_them(guard, state: Path) -> None:
    # issue 30.13: the guard crashed with a Python error on an unbalanced quote; `exec prog` exited 127
    child = guard("run", "k:quote", "--shell", "echo 'unterminated")
    out = released(child)
    assert child.returncode == 2 and "Traceback" not in out and "unterminated" in out.lower(), out
    child = guard("run", "k:exec", "--shell", "exec printf ran")
    assert released(child) == "ran" and child.returncode == 0
    child = guard("run", "k:cd", "--shell", "A=1 cd /")
    assert released(child) == "" and child.returncode == 0


def test_a_stop_line_stops_the_whole_group_and_the_end_of_the_connection_does_not(guard, state: Path) -> None:
    child = guard("run", "k:stop", "--grace", "0.5", "--shell", "trap '' TERM; sleep 300 & sleep 300 & wait")
    assert wait_for(lambda: (state / "k:stop.pid").exists())
    pgid = int((state / "k:stop.pid").read_text().split()[0])
    started = time.monotonic()
    child.stdin.write("stop\n")  # what tflab says to stop it
    child.stdin.flush()
    assert child.wait(timeout=10) == 137  # it ignored SIGTERM: SIGKILL after the grace
    assert time.monotonic() - started < 5
    assert wait_for(lambda: not live_members(pgid), 5), live_members(pgid)
    assert Ending.from_json((state / "k:stop.exit").read_text()) == Ending(137, "SIGKILL", "stopped")

    # The end of the connection is no lifeline: renewed leases keep it; unrenewed, the lease lapses.
    child = guard("run", "k:close", "--grace", "0.5", "--shell", "sleep 300 & sleep 300 & wait")
    assert wait_for(lambda: (state / "k:close.pid").exists())
    pgid = int((state / "k:close.pid").read_text().split()[0])
    child.stdin.close()  # what happens when tflab dies, or a stream breaks
    closed = time.monotonic()
    time.sleep(LEASE_S / 2)
    assert child.poll() is None and live_members(pgid), "a closed connection alone stops nothing"
    assert child.wait(timeout=LEASE_S + 5) == 143
    assert LEASE_S - 0.5 < time.monotonic() - closed < LEASE_S + 2
    assert wait_for(lambda: not live_members(pgid), 5), live_members(pgid)
    assert Ending.from_json((state / "k:close.exit").read_text()) == Ending(143, "SIGTERM", "lease")


def test_a_lease_renewed_on_the_host_alone_holds_and_lapses_once_it_is_not(guard, state: Path, env) -> None:
    """tflab renews each lease on the host too, as a file's mtime in the runs folder (tflab.host.leases, the
    HostLeases tflab itself uses): no `renew` word reaches this guard, and the program runs on while that file is
    renewed; once it is not (tflab gone), it lapses within the lease."""
    from tflab.host.leases import HostLeases

    leases = HostLeases()
    runs = Path(env["TFLAB_GUARD_HOST_LEASES"]).parent / "runs"  # runs/.tflab/leases is the nodes' HOST_LEASES
    Path(env["TFLAB_GUARD_HOST_LEASES"]).parent.mkdir(parents=True, exist_ok=True)
    (runs / ".tflab").mkdir(parents=True)
    os.symlink(runs / ".tflab" / "leases", env["TFLAB_GUARD_HOST_LEASES"])
    held = leases.hold(runs, "run:t:worker3")
    child = guard("run", "run:t:worker3", "--grace", "0.5", "--shell", "sleep 300")  # its connection: silent
    assert wait_for(lambda: (state / "run:t:worker3.pid").exists())
    time.sleep(3 * LEASE_S)
    assert child.poll() is None, "held by the host's renewals alone"
    leases.release(held)
    released = time.monotonic()
    assert child.wait(timeout=LEASE_S + 5) == 143
    assert time.monotonic() - released < LEASE_S + 2
    assert Ending.from_json((state / "run:t:worker3.exit").read_text()) == Ending(143, "SIGTERM", "lease")
    assert not held.exists(), "its file goes with its last holder"


def test_a_frozen_node_is_not_a_dead_tflab(guard, state: Path) -> None:
    """A `pause` drill freezes a node's guard with its program while tflab renews on: thawed, it runs on."""
    child = guard("run", "k:frozen", "--grace", "0.5", "--shell", "sleep 300")
    assert wait_for(lambda: (state / "k:frozen.pid").exists())
    pgid = int((state / "k:frozen.pid").read_text().split()[0])
    with renewing(child):  # what tflab does every second, frozen node or not
        for pid in (child.pid, pgid):
            os.killpg(pid, signal.SIGSTOP) if pid == pgid else os.kill(pid, signal.SIGSTOP)
        time.sleep(2 * LEASE_S)  # longer than the lease: the holder file ages, renewals queue
        os.kill(child.pid, signal.SIGCONT)
        os.killpg(pgid, signal.SIGCONT)
        time.sleep(1.5)
        assert child.poll() is None and live_members(pgid), "a thawed guard stopped its program for a lapse"
    child.stdin.write("stop\n")
    child.stdin.flush()
    assert child.wait(timeout=10) == 143
    assert Ending.from_json((state / "k:frozen.exit").read_text()) == Ending(143, "SIGTERM", "stopped")


def test_a_look_at_a_lease_after_a_freeze_waits_for_the_renewals_that_queued() -> None:
    now = [100.0]
    fresh = []
    watch = leases.Watch("l", clock=lambda: now[0], fresh=lambda _lease: list(fresh))
    assert watch.lapsed()  # nobody holds it and this process ran all along: lapsed
    now[0] += 0.1
    fresh.append("h")
    assert not watch.lapsed()
    fresh.clear()
    now[0] += leases.FROZEN_S + 10  # frozen: nothing was read meanwhile
    assert not watch.lapsed()
    for _ in range(5):
        now[0] += 0.5
        assert not watch.lapsed()  # still reading what queued
    now[0] += 0.5
    assert watch.lapsed()  # three renewals' time and still none: tflab is gone


def test_probe_waits_for_a_port_and_tells_an_ended_server(verb, state: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert verb("probe", f"localhost:{port}", "--timeout", "5") == 0
    assert verb("probe", f"127.0.0.1:{port}", "--timeout", "0.5") == 4
    state.mkdir(parents=True, exist_ok=True)
    (state / "k:dead.exit").write_text("1\n")
    assert verb("probe", f"127.0.0.1:{port}", "--key", "k:dead", "--timeout", "5") == 3


def probe_answer(python: Path, zipapp: Path, env, *args: str) -> tuple[int, str]:
    real = subprocess.run([str(python), str(zipapp), "probe", "127.0.0.1:9", *args], capture_output=True,
                          universal_newlines=True, env=env, timeout=60)
    return real.returncode, real.stdout


def test_a_probe_past_its_timeout_tells_a_server_busy_starting_from_a_stuck_one(
        guard, python: Path, zipapp: Path, env, state: Path, tmp_path: Path) -> None:
    """A ps in a node held to 0.1 CPU was still importing TensorFlow when CI's run said 'ps0 did not serve on port
    2222 within 120s'. Asked with --quiet, the probe tells one whose processes use the CPU (5, and how much they
    used) from one whose processes use none (4): that one is stuck. So does the fake of the host's tests."""
    import fakeguard

    spin = tmp_path / "spin.py"
    spin.write_text("while True:\n    pass\n")
    busy = guard("run", "run:t:ps0", "--grace", "0.5", "--shell", f"{python.name} {spin}")
    asleep = guard("run", "run:t:ps1", "--grace", "0.5", "--shell", "sleep 60")
    try:
        with renewing(busy, asleep):
            assert wait_for(lambda: (state / "run:t:ps0.pid").exists() and (state / "run:t:ps1.pid").exists())
            # Past a first timeout, --while-busy: a stuck one is said as soon as it used no CPU for --quiet s.
            for key, is_busy, past, timeout in (("run:t:ps0", True, [], "1.5"), ("run:t:ps1", False, [], "1.5"),
                                                ("run:t:ps0", True, ["--while-busy"], "1.5"),
                                                ("run:t:ps1", False, ["--while-busy"], "30")):
                argv = ["--key", key, "--timeout", timeout, "--quiet", "1", *past]
                pgid = int((state / f"{key}.pid").read_text().split()[0])
                began, cpu_before = time.monotonic(), group_cpu_s(pgid)
                code, out = probe_answer(python, zipapp, env, *argv)
                took, spent = time.monotonic() - began, group_cpu_s(pgid) - cpu_before
                fake_code, fake_out = fakeguard.probe(["probe", "127.0.0.1:9", *argv], None, is_busy,
                                                      sleep=lambda _s: None)
                assert code == fake_code == (5 if is_busy else 4), (key, past, code, out)
                if is_busy:
                    # The CPU its processes used in the probe: no more than /proc says they used meanwhile (a
                    # loaded host gives a spinner little: a fresh clone's run saw 0.1 s in the probe's 1.5 s).
                    used = float(out.split()[1])
                    assert out.split()[0] == fake_out.split()[0] == "busy" and 0 <= used <= spent + 0.05, (out, spent)
                else:
                    assert out == fake_out == ""
                    assert took < 10, f"a stuck server is said after --quiet, not --timeout ({took:.1f}s)"
            # Without --quiet, a probe is the plain wait it was: 4 at its timeout, busy or not.
            assert probe_answer(python, zipapp, env, "--key", "run:t:ps0", "--timeout", "0.5") == (4, "")
            for child in (busy, asleep):
                child.stdin.write("stop\n")
                child.stdin.flush()
            assert busy.wait(timeout=10) == 143 and asleep.wait(timeout=10) == 143
    finally:
        for child in (busy, asleep):
            child.kill()
            child.wait(timeout=10)
            child.stdin.close()


def test_a_shared_server_lives_while_someone_holds_it(guard, verb, python: Path, zipapp: Path, env, state: Path,
                                                      tmp_path: Path) -> None:
    holder = guard("hold", "exec:train", "exec-1")
    assert holder.stdout.readline() == "holding\n"
    with renewing(holder):  # its tflab is there: the lease is held until it leaves
        server = subprocess.Popen([str(python), str(zipapp), "serve", "k:served", "--lease", "exec:train", "--log",
                                   str(tmp_path / "logs" / "ps0.log"), "--shell", "echo up; sleep 300"], env=env)
        assert wait_for(lambda: (state / "k:served.pid").exists())
        assert verb("holders", "exec:train") == 0
        time.sleep(1)
        assert server.poll() is None
    holder.stdin.write("stop\n")
    holder.stdin.flush()
    holder.wait(timeout=5)
    assert verb("holders", "exec:train") == 1
    assert server.wait(timeout=20) == 143  # stopped: nobody holds it any more
    assert (tmp_path / "logs" / "ps0.log").read_text() == "up\n"
    assert Ending.from_json((state / "k:served.exit").read_text()) == Ending(143, "SIGTERM", "lease")


def test_stop_clears_what_an_earlier_run_left_and_only_that(guard, verb, state: Path) -> None:
    leftovers = [guard("run", f"run:train:worker{i}", "--shell", "sleep 300") for i in range(2)]
    other = guard("run", "run:train.v2:worker0", "--shell", "sleep 300")
    with renewing(*leftovers, other):  # their tflab is still there: only the stop ends them
        assert wait_for(lambda: len(list(state.glob("*.pid"))) == 3)
        assert verb("stop", "run:train:*", "--grace", "0.5") == 0
        # Stopped means gone, the guards that ran them included (at most a zombie awaiting our wait).
        assert [child.pid for child in leftovers if running(child.pid)] == []
        for child in leftovers:
            assert child.wait(timeout=10) == 143  # sleep ends at SIGTERM
        assert other.poll() is None, "a task whose name starts like another's is not swept with it"
        assert sorted(p.name for p in state.glob("*.pid")) == ["run:train.v2:worker0.pid"]
    for i in range(2):
        assert Ending.from_json((state / f"run:train:worker{i}.exit").read_text()) == Ending(143, "SIGTERM", "stopped")
    other.stdin.write("stop\n")
    other.stdin.flush()
    other.wait(timeout=10)


# A guard as the real one ends: its record removed once its program has ended, then its own exit, here slow
# (a loaded host's, where the whole interpreter still has to wind down).
LINGERING_GUARD = """
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from tflab_guard import registry
key = sys.argv[2]
registry.begin(key)
program = subprocess.Popen(["sleep", "300"], start_new_session=True)
registry.write_pid(key, program.pid)
print("started", flush=True)
program.wait()
registry.unlink(registry.guard_path(key))
time.sleep(2)
"""


def test_a_stop_returns_once_the_guard_itself_has_exited_not_its_record(python: Path, zipapp: Path, verb, env,
                                                                          state: Path) -> None:
    owner = subprocess.Popen([str(python), "-c", LINGERING_GUARD, str(zipapp), "run:train:worker0"], env=env,
                             stdout=subprocess.PIPE, universal_newlines=True)
    assert owner.stdout.readline() == "started\n"
    began = time.monotonic()
    assert verb("stop", "run:train:*", "--grace", "3") == 0
    assert not running(owner.pid), "stop returned while the guard still ran"
    assert time.monotonic() - began >= 2
    assert owner.wait(timeout=10) == 0, "waited on to its own end (within the grace and a second), not killed"


def test_two_stops_at_once_both_finish_cleanly(python: Path, zipapp: Path, env, state: Path) -> None:
    state.mkdir(parents=True)
    for round_ in range(5):
        for i in range(300):
            (state / f"run:t{round_}:w{i}.exit").write_text("0\n")
        stops = [subprocess.Popen([str(python), str(zipapp), "stop", f"run:t{round_}:*"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
                 for _ in range(2)]
        results = [(s.wait(timeout=60), s.stderr.read()) for s in stops]
        assert results == [(0, ""), (0, "")]
        assert len(list(state.glob(f"run:t{round_}:*.exit"))) == 300, "how they ended is kept for tflab to read"


def test_a_record_written_while_a_reader_looks_is_never_removed_by_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`probe`, `alive` and `stop` read pid files while a program's guard writes its own. A reader that found no
    file, or a dead process's record, must not remove the record written in the meantime."""
    from tflab_guard import registry

    monkeypatch.setattr(registry, "STATE", str(tmp_path))
    path = Path(registry.pid_path("run:t:worker0"))
    real_open = open

    def written_just_after_the_look(file, *args, **kw):  # the reader finds no file; the writer's record lands
        if Path(file) == path and not path.exists():
            registry.write_pid("run:t:worker0", os.getpid())
            raise FileNotFoundError(file)
        return real_open(file, *args, **kw)

    monkeypatch.setattr(registry, "open", written_just_after_the_look, raising=False)
    assert registry.read_pid("run:t:worker0") is None
    monkeypatch.undo()
    monkeypatch.setattr(registry, "STATE", str(tmp_path))
    assert registry.read_pid("run:t:worker0") == os.getpid(), "the record written meanwhile stays"

    # A dead program's record, replaced by the next one's between the read and the removal.
    path.write_text(f"{os.getpid()} 1\n")  # this pid, another start time: a process that has ended
    real_start_time = registry.start_time

    replaced = []

    def replaced_after_the_read(pid):
        if not replaced:
            replaced.append(pid)
            registry._write_atomically(str(path), f"{os.getpid()} {real_start_time(os.getpid())}\n")  # write_pid's way
        return real_start_time(pid)

    monkeypatch.setattr(registry, "start_time", replaced_after_the_read)
    assert registry.read_pid("run:t:worker0") is None, "what it read was a dead process's"
    assert path.exists() and registry.read_pid("run:t:worker0") == os.getpid(), "the new record stays"
    monkeypatch.setattr(registry, "start_time", real_start_time)
    path.write_text(f"{os.getpid()} 1\n")
    assert registry.read_pid("run:t:worker0") is None and not path.exists(), "a stale record read is removed"


def test_the_zipapp_is_the_same_bytes_every_time() -> None:
    assert guard_zipapp() == guard_zipapp()


def test_a_failing_program_shows_its_own_traceback_and_nothing_of_tflab(guard, python: Path, env,
                                                                      tmp_path: Path) -> None:
    """The program is its command line started cold: a traceback shows its own frames only, as on a cluster's machine."""
    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "broken.py"
    program.write_text("import tensorflow\n\ndef main():\n    raise ValueError('bad input')\n\nmain()\n")
    child = guard("run", "run:t:worker0", "--wait-for-go", "--shell", f"{python.name} {program}", env=env)
    out = released(child)
    assert child.returncode == 1
    lines = out.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(f'  File "{program}", line 6'), "the program's own frames, none of the guard's"
    assert "guard.pyz" not in out and "runpy" not in out and "tflab_guard" not in out
    assert lines[-1] == "ValueError: bad input"


COLD_PROGRAM = """import os, sys
import tensorflow
print(os.getpid(), os.getppid(), os.getpgid(0), flush=True)
print(sorted(name for name in sys.modules if name.startswith('tflab_guard') or name == 'runpy'), flush=True)
print(sys.argv, flush=True)
import time
time.sleep(60)
"""


def test_a_program_starts_cold_as_the_guards_child_in_its_own_group_with_nothing_of_tflab(
        guard, python: Path, env, state: Path, tmp_path: Path) -> None:
    """What a cluster's machine shows: `ps` has `tflab-guard run KEY` and, under it, the program's own command line;
    the program leads its own process group, imported TensorFlow itself, and has no module of tflab's loaded."""
    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "train.py"
    program.write_text(COLD_PROGRAM)
    child = guard("run", "run:t:worker1", "--wait-for-go", "--shell", f"{python.name} {program} --task_index=1",
                  env=env, stderr=subprocess.DEVNULL)
    with renewing(child):
        assert not (tmp_path / "imported").exists(), "nothing imports TensorFlow while the program is held"
        child.stdin.write("go\n")
        child.stdin.flush()
        pid, parent, group = (int(word) for word in child.stdout.readline().split())
        assert parent == child.pid and group == pid, "the guard's own child, leading its own process group"
        assert child.stdout.readline().strip() == "[]", "no module of the guard's (nor runpy) in the program"
        assert child.stdout.readline().strip() == f"['{program}', '--task_index=1']"
        assert cmdline(child.pid) == "tflab-guard run run:t:worker1"
        assert cmdline(pid) == f"{python.name} {program} --task_index=1", "ps shows the program's own command line"
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "guard.pyz" not in maps, "nothing of the guard's zipapp is mapped in the program"
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=20) == 143


def test_a_nodes_traffic_is_counted_once_on_a_shaped_link(tmp_path: Path) -> None:
    """shape.sh's ifb device carries what eth0 received again: it is not the node's traffic twice."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "images" / "node"))
    try:
        from tflab_guard import metrics
    finally:
        sys.path.pop(0)
    dev = tmp_path / "dev"
    dev.write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
        "    lo:    5000      10    0    0    0     0          0         0     5000      10    0    0    0     0       0          0\n"
        "  eth0: 1000000    900    0    0    0     0          0         0  2000000    800    0    0    0     0       0          0\n"
        "  tfi0:  990000    880    0    0    0     0          0         0   990000    880    0    0    0     0       0          0\n")
    assert metrics.net_sample(str(dev)) == (1000000, 2000000)


# -- how a process ends ---------------------------------------------------------------------------------

ENDING_PROGRAM = """import os, signal, sys, time
import tensorflow
print(os.getpid(), flush=True)
how = sys.argv[1]
if how == "exit3":
    sys.exit(3)
if how == "os_exit3":
    os._exit(3)
if how == "raise":
    raise ValueError("bad input")
if how == "segv":
    import ctypes
    ctypes.string_at(0)
if how == "abort":
    os.abort()
time.sleep(300)
"""
# (how the program ends, who signals it: "outside" (a kill from outside tflab), "tflab" (a stop), or nobody)
ENDINGS = {
    "exit3": (None, Ending(3, None, "exited")),
    "os_exit3": (None, Ending(3, None, "exited")),
    "raise": (None, Ending(1, None, "exited")),
    "segv": (None, Ending(139, "SIGSEGV", "crashed")),
    "abort": (None, Ending(134, "SIGABRT", "crashed")),
    "term_outside": ("SIGTERM", Ending(143, "SIGTERM", "outside")),
    "kill_outside": ("SIGKILL", Ending(137, "SIGKILL", "outside")),
    "stopped": ("stop", Ending(143, "SIGTERM", "stopped")),
}


@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_every_ending_is_known(guard, python: Path, env, state: Path, tmp_path: Path, how: str) -> None:
    """Each way a program ends, as its guard records it."""
    import signal

    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "ending.py"
    program.write_text(ENDING_PROGRAM)
    sender, expected = ENDINGS[how]
    child = guard("run", "run:t:worker0", "--grace", "2", "--shell", f"{python.name} {program} {how}", env=env,
                  stderr=subprocess.DEVNULL)
    with renewing(child):  # tflab is there throughout: the ending is the program's own, never a lapse
        pid = int(child.stdout.readline())
        if sender is not None:  # (the others may have ended already)
            assert ppid_of(pid) == child.pid, "the program is its guard's child"
        if sender == "stop":
            child.stdin.write("stop\n")
            child.stdin.flush()
        elif sender is not None:
            os.kill(pid, getattr(signal, sender))
        assert child.wait(timeout=20) == expected.code
    assert Ending.from_json((state / "run:t:worker0.exit").read_text()) == expected


def test_a_users_pkill_of_the_programs_command_line_reaches_the_program_not_its_guard(
        guard, python: Path, env, state: Path, tmp_path: Path) -> None:
    """`pkill -9 -f train.py`, as a user stops a program on a cluster's machine: the guard's own title names its key,
    not the command line, so the kill reaches the program alone, and the guard records the kill from outside."""
    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "mnist_marker.py"
    program.write_text(ENDING_PROGRAM)
    child = guard("run", "run:t:worker1", "--shell", f"{python.name} {program} sleep", env=env,
                  stderr=subprocess.DEVNULL)
    with renewing(child):
        pid = int(child.stdout.readline())
        assert "mnist_marker" not in cmdline(child.pid) and cmdline(child.pid) == "tflab-guard run run:t:worker1"
        assert "mnist_marker" in cmdline(pid), "ps shows the program's own command line"
        assert subprocess.run(["pkill", "-9", "-f", "mnist_marker.py"]).returncode == 0
        assert child.wait(timeout=20) == 137
    assert Ending.from_json((state / "run:t:worker1.exit").read_text()) == Ending(137, "SIGKILL", "outside")


def test_a_broken_connection_loses_no_output_and_stops_nothing(guard, verb, python: Path, zipapp: Path, env,
                                                               state: Path) -> None:
    child = guard("run", "run:t:worker1", "--shell", "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.3; done; exit 7",
                  stderr=subprocess.DEVNULL)
    first = child.stdout.readline()
    assert first == "line 1\n"
    child.stdout.close()  # the stream breaks (dockerd closed it, an ssh session died): the guard's writes fail
    for _ in range(3):
        child.stdin.write("renew\n")  # tflab is still there
        child.stdin.flush()
        time.sleep(0.5)
    again = subprocess.run([str(python), str(zipapp), "attach", "run:t:worker1", "--out", str(len(first))],
                           input="renew\n", capture_output=True, universal_newlines=True, env=env, timeout=30)
    assert again.stdout == "".join(f"line {i}\n" for i in range(2, 7)), "the rest of its output, once"
    assert again.returncode == 7 and child.wait(timeout=10) == 7, "it ran to its own end"
    assert Ending.from_json((state / "run:t:worker1.exit").read_text()) == Ending(7, None, "exited")

    from tflab_guard.protocol import EndSplitter, StreamEnd

    def attach_answering(out: int, answer: str) -> tuple[int, bytes, StreamEnd | None]:
        """An attach that asks for the end line, and tflab's answer to it: exit code, output, the end line."""
        done = subprocess.run([str(python), str(zipapp), "attach", "run:t:worker1", "--out", str(out),
                               "--end-in-stream"], input=answer.encode(), capture_output=True, env=env, timeout=30)
        streams = EndSplitter(), EndSplitter()
        own = streams[0].feed(done.stdout) + streams[0].rest()
        streams[1].feed(done.stderr)
        assert streams[0].end is not None and streams[1].end is not None, "the end line ends both streams"
        assert streams[0].end.kept == streams[1].end.kept
        return done.returncode, own, streams[0].end

    total = len("".join(f"line {i}\n" for i in range(1, 7)))
    # the guard's writes succeeded; only tflab knows what reached it: here a byte less than the node kept
    code, own, told = attach_answering(total, f"delivered {total - 1} 0\n")
    assert (code, own, told.ending, told.kept) == (7, b"", Ending(7, None, "exited"), [total, 0])
    assert sorted(p.name for p in (state / "out").iterdir()) == ["run:t:worker1.err", "run:t:worker1.out"], \
        "the node keeps its copy while tflab lacks some of it"
    assert attach_answering(total, f"delivered {total} 0\n")[0] == 7
    assert not list((state / "out").iterdir()), "the kept output goes once tflab says it has all of it"
    assert (state / "run:t:worker1.exit").exists(), "how it ended stays: a probe of this start may look for it"


def test_a_reader_that_is_gone_gets_no_more_output_and_the_ending_at_once(guard, state: Path) -> None:
    """`tflab exec worker0 -- yes | head -1`: head has its line; `drop` then `stop`. The guard stops following the
    output the node keeps (gigabytes of `y` by then, a minute through a docker exec) and ends both streams at once."""
    from tflab_guard.protocol import END_MARK, EndSplitter

    child = subprocess.Popen([*guard.argv, "run", "exec:cmd:worker0:1", "--end-in-stream", "--", "yes"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=guard.env)
    assert child.stdout.read(2) == b"y\n"
    time.sleep(1)  # `yes` writes on, into the node's copy
    child.stdin.write(b"drop\nstop\n")
    child.stdin.flush()
    began = time.monotonic()
    out, err = child.communicate(timeout=30)
    assert time.monotonic() - began < 10, "the end comes at once, not after the copy"
    splitter = EndSplitter()
    splitter.feed(out)
    assert END_MARK in err and splitter.end is not None, "both streams end with the end line"
    assert (splitter.end.ending.signal, splitter.end.ending.reason) == ("SIGTERM", "stopped")
    assert len(out) < splitter.end.kept[0], "what `yes` wrote after the drop was not sent"
    assert not list((state / "out").iterdir()), "the node forgets what nobody will read"


def test_an_attach_to_a_process_whose_guard_was_killed_with_it_says_its_end_is_lost_at_once(
        guard, python: Path, zipapp: Path, env, state: Path) -> None:
    """A drill's `kill worker1` kills every process of the node, the guard too: nobody recorded how the program
    ended. tflab's attach reads what the node kept and says the end is lost in its end line, at once (it said
    'no process' on stderr, taken for the program's output, and tflab attached five times more, 8 s)."""
    from tflab_guard.protocol import EndSplitter

    child = guard("run", "run:t:w9", "--shell", "echo one; echo two; sleep 60", stderr=subprocess.DEVNULL)
    assert child.stdout.readline() == "one\n"
    time.sleep(0.3)
    os.killpg(int((state / "run:t:w9.pid").read_text().split()[0]), signal.SIGKILL)
    child.kill()
    child.wait(timeout=10)
    began = time.monotonic()
    done = subprocess.run([str(python), str(zipapp), "attach", "run:t:w9", "--out", "4", "--end-in-stream"],
                          input=b"", capture_output=True, env=env, timeout=30)
    out, err = EndSplitter(), EndSplitter()
    own = out.feed(done.stdout) + out.rest()
    assert err.feed(done.stderr) + err.rest() == b"", "nothing said as if the program had said it"
    assert own == b"two\n" and out.end is not None and out.end.ending == Ending(255, None, "lost")
    assert done.returncode == 255 and time.monotonic() - began < 5


def test_a_probe_of_a_new_start_takes_no_earlier_ending_for_its_own(guard, verb, state: Path) -> None:
    """Until the new start's guard begins, the node still has the last start's ending (one whose end line never
    reached tflab): a probe of the new one must wait for its server, not say it ended before serving."""
    assert guard("run", "run:t:ps0", "--id", "1-a", "--shell", "exit 3").wait(timeout=10) == 3
    assert verb("probe", "127.0.0.1:9", "--key", "run:t:ps0", "--id", "2-b", "--timeout", "0.5") == 4
    assert verb("probe", "127.0.0.1:9", "--key", "run:t:ps0", "--id", "1-a", "--timeout", "5") == 3
    assert guard("run", "run:t:ps0", "--id", "2-b", "--shell", "exit 4").wait(timeout=10) == 4
    assert verb("probe", "127.0.0.1:9", "--key", "run:t:ps0", "--id", "2-b", "--timeout", "5") == 3


def test_a_stop_reaches_only_what_this_nodes_guards_started(guard, verb, python: Path, zipapp: Path, env,
                                                            state: Path, tmp_path: Path) -> None:
    """The unit tests once killed a running lab's training (a stop matched guards by their argv in /proc)."""
    lookalike = tmp_path / "elsewhere" / "guard.pyz"
    lookalike.parent.mkdir()
    lookalike.write_text("import time\ntime.sleep(60)\n")
    decoy = subprocess.Popen([str(python), str(lookalike), "run", "run:train:worker0", "--shell", "python3 x.py"])
    other_lab = {**env, "TFLAB_GUARD_STATE": str(tmp_path / "other-lab")}
    theirs = guard("run", "run:train:worker0", "--shell", "sleep 60", env=other_lab)
    ours = guard("run", "run:train:worker1", "--shell", "sleep 60")
    with renewing(theirs, ours):  # both labs' tflab is there: only the stop may end anything
        assert wait_for(lambda: (state / "run:train:worker1.pid").exists())
        assert wait_for(lambda: (tmp_path / "other-lab" / "run:train:worker0.pid").exists())
        assert verb("stop", "run:train:*", "--grace", "0.5") == 0
        assert ours.wait(timeout=10) == 143
        time.sleep(0.5)
        assert decoy.poll() is None, "a process that merely looks like a guard is not touched"
        assert theirs.poll() is None, "another lab's (another state's) process is not touched"
    for child in (decoy, theirs):
        child.kill()
        child.wait()


def test_the_fakes_answer_ended_as_the_real_guard_does(guard, verb, python: Path, zipapp: Path, env,
                                                       state: Path) -> None:
    """The host-side tests' fake nodes (tests/fakeguard.py) answer `ended` as guard.pyz does, for each scenario
    they play: a program that exits with its code, and one tflab stops."""
    import fakeguard

    from tflab_guard.protocol import EndSplitter

    exits = guard("run", "k:exits", "--end-in-stream", "--shell", "exit 7")
    exits.stdin.close()  # tflab gone: the end line is not answered
    assert exits.wait(timeout=10) == 7
    stopped = guard("run", "k:stopped", "--end-in-stream", "--shell", "sleep 60")
    assert wait_for(lambda: (state / "k:stopped.pid").exists())
    stopped.stdin.write("stop\n")
    stopped.stdin.close()
    assert stopped.wait(timeout=10) == 143
    for child, key, code, was_stopped in ((exits, "k:exits", 7, False), (stopped, "k:stopped", 143, True)):
        real = subprocess.run([str(python), str(zipapp), "ended", key], capture_output=True,
                              universal_newlines=True, env=env, timeout=30)
        assert (real.returncode, real.stdout) == fakeguard.ended(code, was_stopped)
        splitter = EndSplitter()
        splitter.feed(child.stdout.read().encode())
        assert splitter.end is not None and splitter.end.ending == fakeguard.end(code, was_stopped).ending
    real = subprocess.run([str(python), str(zipapp), "ended", "k:never"], capture_output=True,
                          universal_newlines=True, env=env, timeout=30)
    assert (real.returncode, real.stdout) == fakeguard.ended(None, False)


def test_the_fakes_answer_stack_as_the_real_guard_does(guard, python: Path, zipapp: Path, env, state: Path,
                                                       tmp_path: Path) -> None:
    """`stack KEY`: py-spy's dump of the program, which the host reads (run/waits) as the fakes' real dumps are read;
    and for a key whose process has ended, what fakeguard.stack(None) answers."""
    import fakeguard
    import sysconfig

    from tflab.run.waits import WaitKind, where_it_waits

    env = {**env, "PATH": f"{env['PATH']}:{sysconfig.get_path('scripts')}"}  # tflab's py-spy (the node's is shipped)
    program = tmp_path / "retry.py"
    program.write_text("import time\n\ndef wait_for_peer():\n    while True:\n        time.sleep(0.2)\n\n"
                       "wait_for_peer()\n")
    child = guard("run", "run:t:worker1", "--shell", f"{python.name} {program}", env=env)
    with renewing(child):
        assert wait_for(lambda: (state / "run:t:worker1.pid").exists())
        time.sleep(0.5)
        real = subprocess.run([str(python), str(zipapp), "stack", "run:t:worker1"], capture_output=True,
                              universal_newlines=True, env=env, timeout=60)
        assert real.returncode == fakeguard.stack("own_retry_loop")[0], real.stderr
        wait = where_it_waits(real.stdout)
        assert wait.kind == WaitKind.OWN and wait.at == "wait_for_peer (retry.py:5) ← <module> (retry.py:7)", real.stdout
        child.stdin.write("stop\n")
        child.stdin.flush()
        assert child.wait(timeout=20) == 143
    gone = subprocess.run([str(python), str(zipapp), "stack", "run:t:worker1"], capture_output=True,
                          universal_newlines=True, env=env, timeout=60)
    assert (gone.returncode, gone.stdout) == fakeguard.stack(None)


OLD_GUARDS_ANSWER = (2, "usage: tflab-guard [-h]\n                   {run,serve,hold,standby,warm,held,probe,alive,"
                        "metrics,ended,stop}\n                   ...\ntflab-guard: error: unrecognized arguments: "
                        "--protocol 2\n")  # the guard before protocol 2, asked to stop (its real answer)


def test_a_node_with_an_older_guard_is_told_to_run_up(python: Path, zipapp: Path, env) -> None:
    from tflab_guard.protocol import VERSION

    from tflab.engine import guardcmd, guardwait
    from tflab.errors import UserError

    assert "--protocol" in guardcmd.stop(["run:t:*"])
    with pytest.raises(UserError, match=r"older tflab guard.*`tflab up`"):
        guardwait.check_stopped(OLD_GUARDS_ANSWER)
    guardwait.check_stopped((0, ""))
    # This guard, asked by a newer tflab, refuses as an older guard does: that tflab then says `tflab up`.
    newer = subprocess.run([str(python), str(zipapp), "stop", "run:t:*", "--protocol", str(VERSION + 1)],
                           capture_output=True, universal_newlines=True, env=env, timeout=30)
    with pytest.raises(UserError, match=r"older tflab guard"):
        guardwait.check_stopped((newer.returncode, newer.stdout + newer.stderr))


def test_a_stop_that_forgets_leaves_no_ending_to_answer_for_the_next_run(guard, verb, state: Path) -> None:
    """A soak found it: the last run's ps ending, still recorded, answered the next run's probe ('ended before
    serving'), and a healthy run failed with 'ps0 did not serve'. A run's first clear forgets them."""
    child = guard("run", "run:t:ps0", "--shell", "exit 3")
    assert child.wait(timeout=10) == 3
    assert verb("probe", "127.0.0.1:9", "--key", "run:t:ps0", "--timeout", "5") == 3  # kept: tflab reads it
    assert verb("stop", "run:t:*", "--force") == 0 and (state / "run:t:ps0.exit").exists()
    assert verb("stop", "run:t:*", "--force", "--forget") == 0
    assert not (state / "run:t:ps0.exit").exists()
    assert verb("probe", "127.0.0.1:9", "--key", "run:t:ps0", "--timeout", "0.5") == 4


def test_each_ending_in_words() -> None:
    assert Ending(3).sentence() == "exited with 3"
    assert Ending(127, None, "refused").sentence() == "could not be started (exit 127)"
    assert Ending(139, "SIGSEGV", "crashed").sentence() == "crashed with SIGSEGV"
    assert Ending(137, "SIGKILL", "outside").sentence() == "killed by SIGKILL from outside tflab"
    assert Ending(143, "SIGTERM", "stopped").sentence() == "stopped by tflab with SIGTERM"
    assert Ending(143, "SIGTERM", "lease").sentence() == \
        "stopped with SIGTERM when tflab's lease lapsed: tflab was gone"
    assert Ending(137, "SIGKILL", "oom").sentence() == "killed by the kernel's out-of-memory killer (SIGKILL)"
    assert Ending.from_json(Ending(139, "SIGSEGV", "crashed").to_json()) == Ending(139, "SIGSEGV", "crashed")
    assert Ending.from_json("137 oom") is None, "an older guard's answer is no record"
