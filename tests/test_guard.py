"""The in-node guard, run here on the host's Python: held starts, preloading, stops, leases, probes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

GUARD = REPO / "images" / "node" / "guard.py"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("TFLAB_GUARD_STATE", str(folder))
    return folder


def guard(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(GUARD), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def released(child: subprocess.Popen) -> str:
    """Send `go`, keep the connection open until the process ends by itself; its output."""
    child.stdin.write("go\n")
    child.stdin.flush()
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


def wait_for(check, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_held_process_starts_on_go_and_passes_its_exit_code(state: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    child = guard("run", "k.held", "--held", "--shell", f"touch {marker}; echo done; exit 7")
    time.sleep(0.5)
    assert not marker.exists(), "a held process must not start before go"
    out = released(child)
    assert child.returncode == 7 and out == "done\n" and marker.exists()
    assert (state / "k.held.exit").read_text() == "7\n"


def test_the_end_of_the_connection_stops_the_whole_group_even_when_it_ignores_term(state: Path) -> None:
    child = guard("run", "k.group", "--grace", "0.5", "--shell", "trap '' TERM; sleep 300 & sleep 300 & wait")
    assert wait_for(lambda: (state / "k.group.pid").exists())
    pgid = int((state / "k.group.pid").read_text().split()[0])
    started = time.monotonic()
    child.stdin.close()  # what happens when tflab stops it, or dies
    assert child.wait(timeout=10) == 137
    assert time.monotonic() - started < 5
    assert wait_for(lambda: not live_members(pgid), 5), live_members(pgid)


def test_preload_imports_tensorflow_while_held_then_runs_the_program_as_main(state: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    stamp = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(stamp)!r}, 'w').write('x')\n__version__ = 'fake'\n")
    program = tmp_path / "prog" / "train.py"
    program.parent.mkdir()
    (program.parent / "helper.py").write_text("VALUE = 42\n")
    program.write_text(
        "import sys\nimport tensorflow as tf\nimport helper\n"
        "print('main' if __name__ == '__main__' else __name__, sys.argv, tf.__version__, helper.VALUE)\n"
        "sys.exit(3)\n"
    )
    python = Path(sys.executable)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "PATH": f"{python.parent}:{os.environ['PATH']}"}
    child = guard("run", "k.pre", "--held", "--preload", "--shell", f"{python.name} {program} --job_name=worker x",
                  env=env)
    assert wait_for(stamp.exists), "TensorFlow is imported while the process is held"
    out = released(child)
    assert out == f"main ['{program}', '--job_name=worker', 'x'] fake 42\n"
    assert child.returncode == 3


def test_probe_waits_for_a_port_and_tells_an_ended_server(state: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ok = subprocess.run([sys.executable, str(GUARD), "probe", f"localhost:{port}", "--timeout", "5"])
        assert ok.returncode == 0
    assert subprocess.run([sys.executable, str(GUARD), "probe", f"127.0.0.1:{port}", "--timeout", "0.5"]).returncode == 4
    state.mkdir(parents=True, exist_ok=True)
    (state / "k.dead.exit").write_text("1\n")
    ended = subprocess.run([sys.executable, str(GUARD), "probe", f"127.0.0.1:{port}", "--key", "k.dead", "--timeout", "5"])
    assert ended.returncode == 3


def test_a_shared_server_lives_while_someone_holds_it(state: Path, tmp_path: Path) -> None:
    holder = guard("hold", "exec.train")
    assert holder.stdout.readline() == "holding\n"
    server = subprocess.Popen([sys.executable, str(GUARD), "serve", "k.served", "--lease", "exec.train",
                               "--log", str(tmp_path / "logs" / "ps0.log"), "--shell", "echo up; sleep 300"])
    assert wait_for(lambda: (state / "k.served.pid").exists())
    assert subprocess.run([sys.executable, str(GUARD), "held", "exec.train"]).returncode == 0
    time.sleep(1)
    assert server.poll() is None
    holder.stdin.close()
    holder.wait(timeout=5)
    assert subprocess.run([sys.executable, str(GUARD), "held", "exec.train"]).returncode == 1
    assert server.wait(timeout=20) != 0  # stopped: nobody holds it any more
    assert (tmp_path / "logs" / "ps0.log").read_text() == "up\n"


def test_stop_clears_what_an_earlier_run_left(state: Path) -> None:
    leftovers = [guard("run", f"run.train.worker{i}", "--shell", "sleep 300") for i in range(2)]
    other = guard("run", "run.other.worker0", "--shell", "sleep 300")
    assert wait_for(lambda: len(list(state.glob("*.pid"))) == 3)
    done = subprocess.run([sys.executable, str(GUARD), "stop", "run.train.*", "--grace", "0.5"])
    assert done.returncode == 0
    # Stopped means gone, the guards that ran them included (at most a zombie awaiting our wait).
    assert [child.pid for child in leftovers if running(child.pid)] == []
    for child in leftovers:
        assert child.wait(timeout=10) in (143, 137)
    assert other.poll() is None and sorted(p.name for p in state.glob("*.pid")) == ["run.other.worker0.pid"]
    other.stdin.close()
    other.wait(timeout=10)


def fake_tensorflow(tmp_path: Path) -> dict[str, str]:
    """An environment whose `tensorflow` is a stub that notes when it is imported."""
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    python = Path(sys.executable)
    return {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "PATH": f"{python.parent}:{os.environ['PATH']}"}


def test_a_warm_standby_becomes_the_program_with_its_environment_and_output(state: Path, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path)
    standby = subprocess.Popen([sys.executable, str(GUARD), "standby", "--idle", "60"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: subprocess.run([sys.executable, str(GUARD), "warm"], env=env).returncode == 0)
    program = tmp_path / "prog.py"
    program.write_text(
        "import os, sys\nimport tensorflow\n"
        "print(os.getpid(), tensorflow.IMPORTED_IN, os.environ['ONLY_HERE'], os.getcwd(), sys.argv[1:], __name__,"
        " sep='|')\n"
        "sys.stderr.write('to stderr\\n')\nsys.exit(5)\n"
    )
    cwd = tmp_path / "work"
    cwd.mkdir()
    child = guard("run", "run.t.worker0", "--warm", "--shell", f"{Path(sys.executable).name} {program} a b",
                  env={**env, "ONLY_HERE": "task-env"}, cwd=cwd)
    out = released(child)
    assert child.returncode == 5
    lines = out.splitlines()
    pid, imported, only, where, argv, name = lines[0].split("|")
    assert pid == imported == str(standby.pid), "the program ran in the standby, TensorFlow imported before"
    assert (only, where, argv, name) == ("task-env", str(cwd), "['a', 'b']", "__main__")
    assert lines[1] == "to stderr"
    assert standby.wait(timeout=10) == 5
    assert subprocess.run([sys.executable, str(GUARD), "warm"], env=env).returncode == 1  # used up


def test_without_a_standby_a_warm_run_starts_as_usual_and_a_stopped_one_ends(state: Path, tmp_path: Path) -> None:
    env = fake_tensorflow(tmp_path)
    done = guard("run", "run.t.worker1", "--warm", "--shell", "echo plain", env=env)
    assert released(done) == "plain\n" and done.returncode == 0
    standby = subprocess.Popen([sys.executable, str(GUARD), "standby"], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: subprocess.run([sys.executable, str(GUARD), "warm"], env=env).returncode == 0)
    program = tmp_path / "forever.py"
    program.write_text("import time\nimport tensorflow\nprint('up', flush=True)\ntime.sleep(300)\n")
    child = guard("run", "run.t.worker2", "--warm", "--grace", "0.5", "--shell",
                  f"{Path(sys.executable).name} {program}", env=env)
    assert child.stdout.readline() == "up\n"
    child.stdin.close()  # tflab goes away
    assert child.wait(timeout=10) != 0
    assert standby.wait(timeout=10) != 0
