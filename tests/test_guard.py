"""The in-node guard (guard.pyz, as nodes get it) run here: held starts, preloading, stops, leases, probes.

Every test runs under this Python and under the oldest one the machine has (pyenv's 3.6, the
Python of TensorFlow 1.15's images) where it is installed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tflab.render.image_files import guard_zipapp

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
        pytest.skip("no Python 3.6 on this machine (pyenv's 3.6 runs the guard as TensorFlow 1.15's images would)")
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
    return folder


@pytest.fixture
def env(python: Path, state: Path) -> dict[str, str]:
    """The environment of a node whose `python` is the interpreter under test (and whose state folder is `state`)."""
    return {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "TFLAB_GUARD_STATE": str(state)}


@pytest.fixture
def guard(python: Path, zipapp: Path, state: Path, env: dict[str, str]):
    """Start the guard with these arguments (stdin a pipe: tflab's connection)."""

    def start(*args: str, **kw) -> subprocess.Popen:
        kw.setdefault("env", env)
        return subprocess.Popen([str(python), str(zipapp), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=kw.pop("stderr", subprocess.STDOUT), universal_newlines=True, **kw)

    return start


@pytest.fixture
def verb(python: Path, zipapp: Path, state: Path, env: dict[str, str]):
    """Run a guard verb to its end; its exit code."""

    def call(*args: str, **kw) -> int:
        kw.setdefault("env", env)
        return subprocess.run([str(python), str(zipapp), *args], stdin=subprocess.DEVNULL, timeout=60, **kw).returncode

    return call


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


def live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that are not zombies (reaping orphans is up to the host's init)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    """What `ps -ef` shows for `pid`."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()


def wait_for(check, seconds: float = 10.0) -> bool:
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
    child = guard("run", "k:held", "--held", "--shell", f"touch {marker}; echo done; exit 7")
    time.sleep(0.5)
    assert not marker.exists(), "a held process must not start before go"
    out = released(child)
    assert child.returncode == 7 and out == "done\n" and marker.exists()
    assert (state / "k:held.exit").read_text() == "7\n"


def test_a_line_that_sets_variables_runs_as_a_shell_would_run_it(guard) -> None:
    child = guard("run", "k:env", "--shell", "GREETING=hello TF_CPP_MIN_LOG_LEVEL=0 printenv GREETING TF_CPP_MIN_LOG_LEVEL")
    assert released(child) == "hello\n0\n" and child.returncode == 0


def test_a_missing_program_exits_127_with_a_sentence(guard, state: Path) -> None:
    child = guard("run", "k:typo", "--shell", "pyhton /workspace/train.py --x=1")
    out = released(child)
    assert child.returncode == 127
    assert out == "tflab: pyhton: command not found on the node's PATH (exit 127)\n"
    assert (state / "k:typo.exit").read_text() == "127\n"
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


def test_a_stop_line_or_the_end_of_the_connection_stops_the_whole_group(guard, state: Path) -> None:
    for how in ("stop", "close"):
        child = guard("run", f"k:{how}", "--grace", "0.5", "--shell", "trap '' TERM; sleep 300 & sleep 300 & wait")
        assert wait_for(lambda: (state / f"k:{how}.pid").exists())
        pgid = int((state / f"k:{how}.pid").read_text().split()[0])
        started = time.monotonic()
        if how == "stop":
            child.stdin.write("stop\n")  # what tflab says to stop it
            child.stdin.flush()
        else:
            child.stdin.close()  # what happens when tflab dies
        assert child.wait(timeout=10) == 137
        assert time.monotonic() - started < 5
        assert wait_for(lambda: not live_members(pgid), 5), live_members(pgid)


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
    child = guard("run", "k:pre", "--held", "--preload", "--shell", f"{python.name} {program} --job_name=worker x",
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


def test_a_shared_server_lives_while_someone_holds_it(guard, verb, python: Path, zipapp: Path, env, state: Path,
                                                      tmp_path: Path) -> None:
    holder = guard("hold", "exec:train")
    assert holder.stdout.readline() == "holding\n"
    server = subprocess.Popen([str(python), str(zipapp), "serve", "k:served", "--lease", "exec:train",
                               "--log", str(tmp_path / "logs" / "ps0.log"), "--shell", "echo up; sleep 300"], env=env)
    assert wait_for(lambda: (state / "k:served.pid").exists())
    assert verb("held", "exec:train") == 0
    time.sleep(1)
    assert server.poll() is None
    holder.stdin.write("stop\n")
    holder.stdin.flush()
    holder.wait(timeout=5)
    assert verb("held", "exec:train") == 1
    assert server.wait(timeout=20) != 0  # stopped: nobody holds it any more
    assert (tmp_path / "logs" / "ps0.log").read_text() == "up\n"


def test_stop_clears_what_an_earlier_run_left_and_only_that(guard, verb, state: Path) -> None:
    leftovers = [guard("run", f"run:train:worker{i}", "--shell", "sleep 300") for i in range(2)]
    other = guard("run", "run:train.v2:worker0", "--shell", "sleep 300")
    assert wait_for(lambda: len(list(state.glob("*.pid"))) == 3)
    assert verb("stop", "run:train:*", "--grace", "0.5") == 0
    # Stopped means gone, the guards that ran them included (at most a zombie awaiting our wait).
    assert [child.pid for child in leftovers if running(child.pid)] == []
    for child in leftovers:
        assert child.wait(timeout=10) in (143, 137)
    assert other.poll() is None, "a task whose name starts like another's is not swept with it"
    assert sorted(p.name for p in state.glob("*.pid")) == ["run:train.v2:worker0.pid"]
    other.stdin.close()
    other.wait(timeout=10)


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
        assert not list(state.glob(f"run:t{round_}:*"))


def test_a_warm_standby_becomes_the_program_with_its_environment_output_and_title(
        guard, verb, python: Path, zipapp: Path, env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standby = subprocess.Popen([str(python), str(zipapp), "standby", "--idle", "60"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: verb("warm", env=env) == 0)
    program = tmp_path / "prog.py"
    program.write_text(
        "import os, sys\nimport tensorflow\n"
        "print(os.getpid(), tensorflow.IMPORTED_IN, os.environ['ONLY_HERE'], os.getcwd(), sys.argv[1:], __name__,"
        " sep='|')\n"
        "print(open('/proc/%d/cmdline' % os.getpid(), 'rb').read().rstrip(b'\\0').decode(), flush=True)\n"
        "sys.stderr.write('to stderr\\n')\nsys.exit(5)\n"
    )
    cwd = tmp_path / "work"
    cwd.mkdir()
    child = guard("run", "run:t:worker0", "--warm", "--shell", f"{python.name} {program} a 'b c'",
                  env={**env, "ONLY_HERE": "task-env"}, cwd=cwd)
    out = released(child)
    assert child.returncode == 5
    lines = out.splitlines()
    pid, imported, only, where, argv, name = lines[0].split("|")
    assert pid == imported == str(standby.pid), "the program ran in the standby, TensorFlow imported before"
    assert (only, where, argv, name) == ("task-env", str(cwd), "['a', 'b c']", "__main__")
    assert lines[1] == f"{python.name} {program} a 'b c'", "ps shows the program, not tflab's standby"
    assert lines[2] == "to stderr"
    assert standby.wait(timeout=10) == 5
    assert verb("warm", env=env) == 2  # used up: none there


def test_one_standby_per_node_and_one_claimant_gets_it(guard, verb, python: Path, zipapp: Path, env, state: Path,
                                                        tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standbys = [subprocess.Popen([str(python), str(zipapp), "standby", "--idle", "60"], env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(3)]
    assert wait_for(lambda: verb("warm", env=env) == 0)
    assert wait_for(lambda: sum(s.poll() is None for s in standbys) == 1), "the others left at once"
    (kept,) = [s.pid for s in standbys if s.poll() is None]
    program = tmp_path / "prog.py"
    program.write_text(f"import os, time\nimport tensorflow\ntime.sleep(1)\nprint(os.getpid() == {kept})\n")
    children = [guard("run", f"run:t:worker{i}", "--warm", "--shell", f"{python.name} {program}", env=env)
                for i in range(3)]
    outputs = [ended(child) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], outputs
    assert sorted(outputs) == ["False\n", "False\n", "True\n"], "one ran in the standby, the others on their own"


def test_without_a_standby_a_warm_run_starts_as_usual_and_a_stopped_one_ends(guard, verb, python: Path, zipapp: Path,
                                                                            env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    done = guard("run", "run:t:worker1", "--warm", "--shell", "echo plain", env=env)
    assert released(done) == "plain\n" and done.returncode == 0
    standby = subprocess.Popen([str(python), str(zipapp), "standby"], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: verb("warm", env=env) == 0)
    program = tmp_path / "forever.py"
    program.write_text("import time\nimport tensorflow\nprint('up', flush=True)\ntime.sleep(300)\n")
    child = guard("run", "run:t:worker2", "--warm", "--grace", "0.5", "--shell", f"{python.name} {program}", env=env)
    assert child.stdout.readline() == "up\n"
    assert cmdline(standby.pid) == f"{python.name} {program}"
    child.stdin.close()  # tflab goes away
    assert child.wait(timeout=10) != 0
    assert standby.wait(timeout=10) != 0


def test_the_zipapp_is_the_same_bytes_every_time() -> None:
    assert guard_zipapp() == guard_zipapp()


def test_a_failing_program_in_the_warm_interpreter_shows_its_own_traceback(guard, verb, python: Path, zipapp: Path,
                                                                          env, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path, env)
    standby = subprocess.Popen([str(python), str(zipapp), "standby", "--idle", "60"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: verb("warm", env=env) == 0)
    program = tmp_path / "broken.py"
    program.write_text("import tensorflow\n\ndef main():\n    raise ValueError('bad input')\n\nmain()\n")
    child = guard("run", "run:t:worker0", "--warm", "--shell", f"{python.name} {program}", env=env)
    out = released(child)
    assert child.returncode == 1 and standby.wait(timeout=10) == 1
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
