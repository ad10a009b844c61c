"""The in-node guard (guard.pyz, as nodes get it) run here: held starts, preloading, stops, leases, probes.

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
    # a standby a warm run's guard made as it ended (it stays until unclaimed for its idle time): gone with the test
    record = folder / "standby.pid"
    if record.exists():
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.killpg(int(record.read_text().split()[0]), signal.SIGKILL)


@pytest.fixture
def env(python: Path, state: Path) -> dict[str, str]:
    """The environment of a node whose `python` is the interpreter under test (and whose state folder is `state`)."""
    return {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "TFLAB_GUARD_STATE": str(state),
            "TFLAB_GUARD_LEASE_S": str(LEASE_S)}


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


def test_preload_imports_tensorflow_while_held_then_runs_the_program_as_main(guard, python: Path, env,
                                                                            tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "prog" / "train.py"
    program.parent.mkdir()
    (program.parent / "helper.py").write_text("VALUE = 42\n")
    program.write_text(
        "import os, sys\nimport tensorflow as tf\nimport helper\n"
        "print('main' if __name__ == '__main__' else __name__, sys.argv, tf.__version__, helper.VALUE)\n"
        "print(open('/proc/%d/cmdline' % os.getpid(), 'rb').read().rstrip(b'\\0').decode())\n"
        "sys.exit(3)\n"
    )
    child = guard("run", "k:pre", "--wait-for-go", "--preload", "--shell", f"{python.name} {program} --job_name=worker x",
                  env=env)
    assert wait_for((tmp_path / "imported").exists), "TensorFlow is imported while the process is held"
    out = released(child).splitlines()
    assert out[0] == f"main ['{program}', '--job_name=worker', 'x'] fake 42"
    assert out[1] == f"{python.name} {program} --job_name=worker x", "ps shows the program's own command line"
    assert child.returncode == 3


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


def test_a_probe_counts_the_standby_a_warm_server_waits_for_as_its_work(
        python: Path, zipapp: Path, env, state: Path, tmp_path: Path) -> None:
    """A warm server whose node's standby still imports TensorFlow has no process of its own yet: the import is
    its start, and a probe past its timeout calls it busy, not stuck."""
    env = slow_tensorflow(tmp_path, env, "busy")
    with importing_standby(python, zipapp, env, state):
        code, out = probe_answer(python, zipapp, env, "--key", "run:t:ps0", "--timeout", "1.5", "--quiet", "1")
    assert code == 5 and out.startswith("busy "), (code, out)


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


def test_a_warm_program_is_a_copy_of_the_standby_with_its_environment_output_and_title(
        guard, verb, standbys, python: Path, env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standby = standbys(env)
    program = tmp_path / "prog.py"
    program.write_text(
        "import os, sys\nimport tensorflow\n"
        "print(os.getpid(), tensorflow.IMPORTED_IN, os.environ['ONLY_HERE'], os.getcwd(), sys.argv[1:], __name__,"
        " os.getppid(), open('/proc/%d/stat' % os.getppid()).read().rsplit(')', 1)[1].split()[1], sep='|')\n"
        "print(open('/proc/%d/cmdline' % os.getpid(), 'rb').read().rstrip(b'\\0').decode(), flush=True)\n"
        "sys.stderr.write('to stderr\\n')\nsys.exit(5)\n"
    )
    cwd = tmp_path / "work"
    cwd.mkdir()
    for round_ in range(2):  # the standby stays: the next program is warm at once
        child = guard("run", f"run:t:worker{round_}", "--warm", "--shell", f"{python.name} {program} a 'b c'",
                      env={**env, "ONLY_HERE": "task-env"}, cwd=cwd)
        out = released(child)
        assert child.returncode == 5
        lines = [line for line in out.splitlines() if line != "to stderr"]  # stdout and stderr are two streams
        assert "to stderr" in out.splitlines()
        pid, imported, only, where, argv, name, parent, grandparent = lines[0].split("|")
        assert imported == str(standby.pid) != pid, "TensorFlow was imported before, by the standby"
        assert grandparent == str(standby.pid), "its parent, its owner, is the standby's child"
        assert (only, where, argv, name) == ("task-env", str(cwd), "['a', 'b c']", "__main__")
        assert lines[1] == f"{python.name} {program} a 'b c'", "ps shows the program, not tflab's standby"
        assert wait_for(lambda: not running(int(parent))), "its owner leaves once it has recorded the end"
        assert Ending.from_json((tmp_path / "state" / f"run:t:worker{round_}.exit").read_text()) == Ending(
            5, None, "exited")
        assert verb("warm", env=env) == 0, "still there for the next program"


def test_one_standby_per_node_and_programs_at_once_all_start_warm(guard, verb, standbys, python: Path, zipapp: Path,
                                                                   env, state: Path, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standby = standbys(env)
    others = [subprocess.Popen([str(python), str(zipapp), "standby", "--idle", "60"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
              for _ in range(2)]
    assert [other.wait(timeout=30) for other in others] == [0, 0], "the others left at once"
    assert children_of(standby.keeper.pid) == [standby.pid]
    program = tmp_path / "prog.py"
    program.write_text("import os, time\nimport tensorflow\ntime.sleep(1)\n"
                       "print(tensorflow.IMPORTED_IN != os.getpid())\n")
    children = [guard("run", f"run:t:worker{i}", "--warm", "--shell", f"{python.name} {program}", env=env)
                for i in range(3)]
    outputs = [ended(child) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    assert outputs == ["True\n", "True\n", "True\n"], "each ran as a copy of the standby, none importing anew"
    assert (tmp_path / "imported").read_text() == "x"


def test_a_forked_program_draws_its_own_random_numbers(guard, standbys, python: Path, env, tmp_path: Path) -> None:
    """Two programs from one standby do not repeat each other's draws (Python's generator; NumPy's global one where
    NumPy is there), as two programs started anew would not."""
    env = fake_tensorflow(tmp_path, env)
    init = tmp_path / "site" / "tensorflow" / "__init__.py"
    # TensorFlow imports NumPy (its global generator seeded then), where this interpreter has it.
    init.write_text("import random\ntry:\n    import numpy.random\nexcept ImportError:\n    pass\n" + init.read_text())
    standbys(env)
    program = tmp_path / "draw.py"
    program.write_text("import os, random\nimport tensorflow\ntry:\n    import numpy\n    n = numpy.random.random()\nexcept ImportError:\n"
                       "    n = None\nprint(random.random(), n, tensorflow.IMPORTED_IN != os.getpid())\n")
    draws = []
    for i in range(2):
        child = guard("run", f"run:t:worker{i}", "--warm", "--shell", f"{python.name} {program}", env=env)
        draws.append(ended(child))
    (python_draws, numpy_draws, warm) = zip(*(draw.split() for draw in draws))
    assert warm == ("True", "True"), "both ran warm"
    assert python_draws[0] != python_draws[1], draws
    assert numpy_draws == ("None", "None") or numpy_draws[0] != numpy_draws[1], draws


def test_without_a_standby_a_warm_run_starts_as_usual_and_a_stopped_one_ends(guard, verb, standbys, python: Path,
                                                                            env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    assert verb("warm", env=env) == 2, "no standby in this node"
    done = guard("run", "run:t:worker1", "--warm", "--shell", "echo plain", env=env)
    assert released(done) == "plain\n" and done.returncode == 0
    assert wait_for(lambda: verb("warm", env=env) == 0), "the next program finds one: its guard made it as it ended"
    standby = standbys(env)  # (that one: a node has one at a time)
    program = tmp_path / "forever.py"
    program.write_text("import time\nimport tensorflow\nprint('up', flush=True)\ntime.sleep(300)\n")
    child = guard("run", "run:t:worker2", "--warm", "--grace", "0.5", "--shell", f"{python.name} {program}", env=env)
    assert child.stdout.readline() == "up\n"
    (warm,) = standby.programs()
    assert cmdline(warm) == f"{python.name} {program}"
    child.stdin.close()  # tflab goes away: its lease lapses
    assert child.wait(timeout=LEASE_S + 10) == 143
    assert wait_for(lambda: not running(warm) and not standby.programs())
    assert Ending.from_json((tmp_path / "state" / "run:t:worker2.exit").read_text()) == Ending(143, "SIGTERM", "lease")
    assert verb("warm", env=env) == 0, "the standby itself goes on"


SETS_BEFORE_IMPORT = """import os, sys
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # as programs written for Keras 2 do
import tensorflow
print("keras at import:", tensorflow.LEGACY_KERAS, "| imported by this process:", tensorflow.IMPORTED_IN == os.getpid(),
      "| argv:", sys.argv[1:], "| folder:", os.getcwd(), flush=True)
sys.exit(4)
"""


@pytest.mark.parametrize("mode", ["cold", "warm", "preload"])
def test_a_program_that_sets_an_import_time_variable_gets_what_a_cold_start_gives_it(
        guard, standbys, python: Path, env, state: Path, tmp_path: Path, mode: str) -> None:
    """A program that sets TF_USE_LEGACY_KERAS before it imports TensorFlow: run cold, it is read at the import; handed
    to the warm interpreter (or preloaded), TensorFlow was imported before it ran, so it is started again in a new
    interpreter, says so, and prints what it prints cold. Its ending is its own."""
    env = fake_tensorflow(tmp_path, env)
    init = tmp_path / "site" / "tensorflow" / "__init__.py"
    init.write_text("import os\nLEGACY_KERAS = os.environ.get('TF_USE_LEGACY_KERAS')\n" + init.read_text())
    program = tmp_path / "prog" / "keras2.py"
    program.parent.mkdir()
    program.write_text(SETS_BEFORE_IMPORT)
    cwd = tmp_path / "work"
    cwd.mkdir()
    if mode == "warm":
        standbys(env)
    options = {"cold": [], "warm": ["--warm"], "preload": ["--wait-for-go", "--preload"]}[mode]
    child = guard("run", f"run:t:{mode}", *options, "--shell", f"{python.name} {program} a 'b c'", env=env, cwd=cwd,
                  stderr=subprocess.PIPE)
    out = released(child) if mode == "preload" else ended(child)
    said = child.stderr.read()
    assert out == f"keras at import: 1 | imported by this process: True | argv: ['a', 'b c'] | folder: {cwd}\n"
    assert child.returncode == 4
    assert Ending.from_json((state / f"run:t:{mode}.exit").read_text()) == Ending(4, None, "exited")
    if mode == "cold":
        assert said == ""
    else:
        assert said == ("tflab: keras2.py sets TF_USE_LEGACY_KERAS before it imports TensorFlow: started again in a new "
                        "Python, as a cluster's machine runs it (this node's warm interpreter had imported TensorFlow "
                        "without it)\n")


def test_what_a_program_sets_after_its_import_or_that_changes_nothing_keeps_it_warm(
        guard, standbys, python: Path, env, tmp_path: Path) -> None:
    """Only a change before the import starts a program again: a variable set to the value it has, one read later
    (TF_CONFIG), the log level, anything set once TensorFlow is imported, and other variables leave it warm."""
    env = fake_tensorflow(tmp_path, {**env, "TF_XLA_FLAGS": "--x"})
    standbys(env)
    program = tmp_path / "late.py"
    program.write_text(
        "import os\nos.environ['TF_XLA_FLAGS'] = '--x'\nos.environ['TF_CONFIG'] = '{}'\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\nos.environ['GREETING'] = 'hi'\n"
        "from tensorflow import IMPORTED_IN\nos.environ['TF_USE_LEGACY_KERAS'] = '1'\ndel os.environ['TF_XLA_FLAGS']\n"
        "import tensorflow\nprint(IMPORTED_IN != os.getpid(), os.environ['TF_USE_LEGACY_KERAS'])\n")
    child = guard("run", "run:t:late", "--warm", "--shell", f"{python.name} {program}", env=env, stderr=subprocess.PIPE)
    assert ended(child) == "True 1\n" and child.returncode == 0
    assert child.stderr.read() == "", "no word of a new start: it ran warm"


class Standby:
    """A standby started for a test: `keeper` is the process started (its parent), `pid` the interpreter."""

    def __init__(self, keeper: subprocess.Popen, pid: int) -> None:
        self.keeper, self.pid = keeper, pid

    def programs(self) -> list[int]:
        """The programs forked from it now running (each its claim's owner's child)."""
        return [pid for owner in children_of(self.pid) for pid in children_of(owner)]


@pytest.fixture
def standbys(python: Path, zipapp: Path, verb, state: Path):
    """Start a standby in `env` (`standbys(env)`), ready once returned; every one started ends after the test
    (a standby stays until it is unclaimed for its idle time)."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str], idle: float = 60) -> Standby:
        keeper = subprocess.Popen([str(python), str(zipapp), "standby", "--idle", str(idle)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(keeper)
        assert wait_for(lambda: verb("warm", env=env) == 0)
        return Standby(keeper, int((state / "standby.pid").read_text().split()[0]))

    yield start
    for keeper in started:
        for pid in children_of(keeper.pid):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        keeper.kill()
        keeper.wait(timeout=10)


def slow_tensorflow(tmp_path: Path, env: dict[str, str], how: str) -> dict[str, str]:
    """fake_tensorflow, whose import takes long: `busy` computes for a minute (its CPU time grows, as a real
    import's does on a sliver of a CPU), `asleep` waits 5 s using no CPU (an import that no longer moves)."""
    env = fake_tensorflow(tmp_path, env)
    init = tmp_path / "site" / "tensorflow" / "__init__.py"
    slow = "began = time.time()\nwhile time.time() - began < 60: pass\n" if how == "busy" else "time.sleep(5)\n"
    init.write_text("import time\n" + slow + init.read_text())
    return env


@contextlib.contextmanager
def importing_standby(python: Path, zipapp: Path, env: dict[str, str], state: Path):
    """A standby started and seen importing (its record written); killed, its interpreter too, at the end."""
    owner = subprocess.Popen([str(python), str(zipapp), "standby", "--idle", "60"], env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record = state / "standby.pid"
    try:
        assert wait_for(record.exists), "the standby never began its import"
        yield owner
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.killpg(int(record.read_text().split()[0]), signal.SIGKILL)
        owner.kill()
        owner.wait(timeout=10)


def test_a_killed_standby_leaves_no_word_that_the_next_is_ready(verb, standbys, python: Path, zipapp: Path, env,
                                                               state: Path, tmp_path: Path) -> None:
    """The out-of-memory killer ends the standby first: its socket stays behind, and the standby made next must not
    be said ready (`warm` 0) while it still imports (a `fault cpu` and a sweep wait on that word)."""
    env = fake_tensorflow(tmp_path, env)
    first = standbys(env)
    os.killpg(first.pid, signal.SIGKILL)
    assert wait_for(lambda: not running(first.pid)) and (state / "standby.sock").exists()
    init = tmp_path / "site" / "tensorflow" / "__init__.py"
    init.write_text("import time\nbegan = time.time()\nwhile time.time() - began < 60: pass\n" + init.read_text())
    with importing_standby(python, zipapp, env, state):
        assert wait_for(lambda: verb("warm", env=env) == 1), "the next one, importing"
        time.sleep(1)
        assert verb("warm", env=env) == 1


def test_a_record_written_while_a_reader_looks_is_never_removed_by_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`warm`, `probe` and `stop` read pid files while a standby or a program writes its own. A reader that found no
    file, or a dead process's record, must not remove the record written in the meantime: a fresh clone's unit run
    saw a standby that was never said ready, its record removed by a `warm` that had looked a moment too early."""
    from tflab_guard import registry

    monkeypatch.setattr(registry, "STATE", str(tmp_path))
    path = Path(registry.pid_path("standby"))
    real_open = open

    def written_just_after_the_look(file, *args, **kw):  # the reader finds no file; the writer's record lands
        if Path(file) == path and not path.exists():
            registry.write_pid("standby", os.getpid())
            raise FileNotFoundError(file)
        return real_open(file, *args, **kw)

    monkeypatch.setattr(registry, "open", written_just_after_the_look, raising=False)
    assert registry.read_pid("standby") is None
    monkeypatch.undo()
    monkeypatch.setattr(registry, "STATE", str(tmp_path))
    assert registry.read_pid("standby") == os.getpid(), "the record written meanwhile stays"

    # A dead standby's record, replaced by the next one's between the read and the removal.
    path.write_text(f"{os.getpid()} 1\n")  # this pid, another start time: a process that has ended
    real_start_time = registry.start_time

    replaced = []

    def replaced_after_the_read(pid):
        if not replaced:
            replaced.append(pid)
            registry._write_atomically(str(path), f"{os.getpid()} {real_start_time(os.getpid())}\n")  # write_pid's way
        return real_start_time(pid)

    monkeypatch.setattr(registry, "start_time", replaced_after_the_read)
    assert registry.read_pid("standby") is None, "what it read was a dead process's"
    assert path.exists() and registry.read_pid("standby") == os.getpid(), "the new record stays"
    monkeypatch.setattr(registry, "start_time", real_start_time)
    path.write_text(f"{os.getpid()} 1\n")
    assert registry.read_pid("standby") is None and not path.exists(), "a stale record read is removed"


@pytest.mark.parametrize("how", ["busy", "asleep"])
def test_a_standby_still_importing_is_waited_for_while_its_import_moves_and_passed_over_once_it_stalls(
        python: Path, zipapp: Path, env, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A node held to a sliver of a CPU imports TensorFlow for a minute: a program started beside that import
    would import it again on the same sliver (a starved ps missed its 120 s to serve so). The claim waits for
    an import whose CPU time grows, however long, and passes over one that used none for `stalled_s`."""
    from tflab_guard import registry, standby

    env = slow_tensorflow(tmp_path, env, how)
    monkeypatch.setattr(registry, "STATE", str(state))
    with importing_standby(python, zipapp, env, state):
        began = time.monotonic()
        claimed = standby.claim(given_up=lambda: time.monotonic() - began > 4, stalled_s=1.0)
        waited = time.monotonic() - began
    if how == "busy":
        assert claimed is None and waited > 4, "it waited for the import, four times its stall bound, until given up"
    else:
        assert claimed is None and 1.0 <= waited < 3.0, f"a stalled import is passed over after 1 s ({waited:.1f} s)"


def test_a_run_told_to_stop_while_its_standby_imports_ends_at_once_and_never_starts(
        guard, python: Path, zipapp: Path, env, state: Path, tmp_path: Path) -> None:
    env = slow_tensorflow(tmp_path, env, "busy")
    marker = tmp_path / "ran"
    program = tmp_path / "prog.py"
    program.write_text(f"open({str(marker)!r}, 'w').close()\nimport tensorflow\n")  # a program for the standby
    with importing_standby(python, zipapp, env, state):
        child = guard("run", "run:t:worker0", "--warm", "--grace", "0.5", "--shell", f"{python.name} {program}",
                      env=env)
        try:
            assert wait_for(lambda: (state / "run:t:worker0.guard").exists())
            child.stdin.write("stop\n")  # what tflab says to stop it
            child.stdin.flush()
            assert child.wait(timeout=10) == 143, "the stop was not heard while the standby imported"
        finally:
            child.kill()  # (a failed test's guard: its connection's end stops what it started)
            child.wait(timeout=10)
            child.stdin.close()
    assert Ending.from_json((state / "run:t:worker0.exit").read_text()) == Ending.never_ran("stopped")
    assert not marker.exists(), "the program never starts"


def test_the_zipapp_is_the_same_bytes_every_time() -> None:
    assert guard_zipapp() == guard_zipapp()


def test_a_failing_program_in_the_warm_interpreter_shows_its_own_traceback(guard, verb, standbys, python: Path,
                                                                          env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standbys(env)
    program = tmp_path / "broken.py"
    program.write_text("import tensorflow\n\ndef main():\n    raise ValueError('bad input')\n\nmain()\n")
    child = guard("run", "run:t:worker0", "--warm", "--shell", f"{python.name} {program}", env=env)
    out = released(child)
    assert child.returncode == 1
    lines = out.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(f'  File "{program}", line 6'), "the program's own frames, none of the guard's"
    assert "guard.pyz" not in out and "runpy" not in out
    assert lines[-1] == "ValueError: bad input"


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


# -- how a process ends, warm and cold (issue 35: the table of endings) ----------------------------------

ENDING_PROGRAM = """import os, signal, sys, time
if sys.argv[2:] == ["sets"]:
    os.environ["TF_XLA_FLAGS"] = "--tf_xla_auto_jit=2"  # read as TensorFlow is imported: a new interpreter's
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


@pytest.mark.parametrize("warm", [False, True, "again"], ids=["cold", "warm", "warm-started-again-cold"])
@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_every_ending_is_known_the_same_warm_and_cold(guard, verb, standbys, python: Path, env, state: Path,
                                                      tmp_path: Path, how: str, warm: bool | str) -> None:
    """The same ending read the same: a program run cold, one forked from the warm interpreter, and one handed to the
    warm interpreter that sets an import-time variable first, and so is started again in a new interpreter (whose
    parent, the warm copy, ends as it ended)."""
    import signal

    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "ending.py"
    program.write_text(ENDING_PROGRAM)
    standby = standbys(env) if warm else None
    sender, expected = ENDINGS[how]
    child = guard("run", "run:t:worker0", *(["--warm"] if warm else []), "--grace", "2", "--shell",
                  f"{python.name} {program} {how}{' sets' if warm == 'again' else ''}", env=env,
                  stderr=subprocess.DEVNULL)
    with renewing(child):  # tflab is there throughout: the ending is the program's own, never a lapse
        pid = int(child.stdout.readline())
        if sender is not None:  # (the others may have ended already)
            owners = children_of(standby.pid) if standby is not None else [child.pid]
            parent = ppid_of(ppid_of(pid)) if warm == "again" else ppid_of(pid)
            assert parent in owners, "the program is its owner's child (its claim's, forked by the standby, or its " \
                                     "guard), or the child of the warm copy that started it again"
        if sender == "stop":
            child.stdin.write("stop\n")
            child.stdin.flush()
        elif sender is not None:
            os.kill(pid, getattr(signal, sender))
        assert child.wait(timeout=20) == expected.code
    assert Ending.from_json((state / "run:t:worker0.exit").read_text()) == expected
    if standby is not None:
        assert verb("warm", env=env) == 0 and wait_for(lambda: not children_of(standby.pid))


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_users_pkill_of_the_programs_command_line_reaches_the_program_not_its_guard(
        guard, verb, standbys, python: Path, env, state: Path, tmp_path: Path, warm: bool) -> None:
    """`pkill -9 -f train.py`, as a user stops a program on a cluster's machine: the guard's own title names its key,
    not the command line, so the kill reaches the program alone, and the guard records the kill from outside. (With
    the command line in its title the guard was killed too: the end was lost, and a warm program, whose watcher stops
    it once its guard is gone, raced the user's SIGKILL with a SIGTERM that was recorded as from outside tflab.)"""
    env = fake_tensorflow(tmp_path, env)
    program = tmp_path / "mnist_marker.py"
    program.write_text(ENDING_PROGRAM)
    standby = standbys(env) if warm else None
    child = guard("run", "run:t:worker1", *(["--warm"] if warm else []), "--shell", f"{python.name} {program} sleep",
                  env=env, stderr=subprocess.DEVNULL)
    with renewing(child):
        pid = int(child.stdout.readline())
        assert "mnist_marker" not in cmdline(child.pid) and cmdline(child.pid) == "tflab-guard run run:t:worker1"
        assert "mnist_marker" in cmdline(pid), "ps shows the program's own command line"
        assert subprocess.run(["pkill", "-9", "-f", "mnist_marker.py"]).returncode == 0
        assert child.wait(timeout=20) == 137
    assert Ending.from_json((state / "run:t:worker1.exit").read_text()) == Ending(137, "SIGKILL", "outside")
    if standby is not None:
        assert verb("warm", env=env) == 0


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
