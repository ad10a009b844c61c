"""The exec path's connection, on public APIs only: what the SDK hands back is read-only for unix engines."""

from __future__ import annotations

import socket

from tflab.engine.attached import GO, STOP
from tflab.engine.executors import writable


def test_a_read_only_socket_file_of_the_sdk_can_still_be_written_to() -> None:
    ours, node = socket.socketpair()
    with ours, node:
        as_sdk_hands_it = ours.makefile("rb", buffering=0)  # socket.SocketIO, mode "rb": write() refuses
        assert not as_sdk_hands_it.writable()
        writer = writable(as_sdk_hands_it)
        writer.sendall(GO)
        writer.sendall(STOP)
        assert node.recv(64) == b"go\nstop\n"
        writer.close()
        node.sendall(b"output")
        assert as_sdk_hands_it.read(6) == b"output", "the SDK's end still reads"


def test_a_socket_is_written_to_as_it_is() -> None:
    ours, node = socket.socketpair()
    with ours, node:
        assert writable(ours) is ours


def _ssh_like(script: str):
    """A local child in _SshProcess, as an ssh client would be (its stdin the guard's input)."""
    import subprocess
    import threading

    from tflab.engine.executors import _SshProcess

    child = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    process = _SshProcess(child)
    out: list[tuple[bytes, bool]] = []
    ends: list[tuple] = []
    done = threading.Event()

    def on_output(chunk: bytes, is_err: bool) -> None:
        out.append((chunk, is_err))
        if chunk.startswith(b"boom"):
            raise RuntimeError("a reader that fails")

    def on_exit(end) -> None:
        ends.append((end.code, end.reason))
        done.set()

    threading.Thread(target=process.pump, args=(on_output, on_exit), daemon=True).start()
    return process, out, ends, done


def test_a_guarded_process_is_released_read_to_its_end_and_ends_once() -> None:
    process, out, ends, done = _ssh_like('read word; echo "got $word"; sleep 0.2; echo boom; sleep 0.2; '
                                         'echo after; exit 3')
    process.release()
    assert done.wait(10) and process.wait(1)
    assert ends == [(3, None)], "read to its end (its exit code), on_exit once"
    assert out[0] == (b"got go\n", False)
    assert not any(b"after" in chunk for chunk, _ in out), "a reader that failed is not called again"
    process.close()  # after the end: nothing to tell, no error


def test_an_ssh_client_that_fails_gives_its_own_last_line_as_the_reason() -> None:
    _process, _out, ends, done = _ssh_like('echo "ssh: connect to host 127.0.0.1 port 2201: Connection refused" >&2; exit 255')
    assert done.wait(10)
    assert ends == [(None, "ssh failed: ssh: connect to host 127.0.0.1 port 2201: Connection refused")]


def test_close_stops_a_held_process() -> None:
    process, _out, ends, done = _ssh_like('read word; [ "$word" = stop ] && exit 143; exit 0')
    process.close()
    assert done.wait(10) and ends == [(143, None)]


def test_a_stream_that_ends_before_all_of_the_output_came_through_is_read_to_its_end(tmp_path) -> None:
    """An engine can close an exec's stream before the last bytes came through, the process having ended: the
    node still holds them. A stream that ends without the guard's end line was cut: tflab attaches again from what
    it had, reads the rest once, and answers the end line with what it read; a stream that brought everything
    (its end line) is answered and not attached again. The end line's bytes never reach the reader."""
    import subprocess
    import threading

    from tflab_guard.protocol import Ending, StreamEnd

    from tflab.engine.attached import Reattach
    from tflab.engine.executors import _SshProcess

    kept = tmp_path / "kept.out"  # what the node kept of the program's output
    kept.write_bytes(b"line 1\nline 2\nworker0: test accuracy 0.9722\n")
    end_line = tmp_path / "end"  # the guard's end line: exited with 3, and all it kept
    end_line.write_bytes(StreamEnd(Ending(3), [kept.stat().st_size, 0]).line())
    answer = tmp_path / "answer"
    attached: list[tuple[int, int]] = []
    tell = f"cat '{end_line}'; cat '{end_line}' >&2; read word; echo \"$word\" > '{answer}'; exit 3"

    def start_child(argv, env=None, workdir="/"):
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def attach(out: int, err: int) -> list[str]:
        attached.append((out, err))
        return ["sh", "-c", f"tail -c +{out + 1} '{kept}'; {tell}"]

    def read(first: list[str]) -> tuple[bytes, list]:
        attached.clear()
        process = _SshProcess(start_child(first), start_child, resume=Reattach(attach))
        out: list[bytes] = []
        ends: list[tuple] = []
        done = threading.Event()
        threading.Thread(target=process.pump, args=(lambda chunk, _err: out.append(chunk),
                                                    lambda end: (ends.append((end.code, end.ending)), done.set())),
                         daemon=True).start()
        assert done.wait(10)
        return b"".join(out), ends

    cut, ends = read(["sh", "-c", "printf 'line 1\\nli'; exit 3"])  # its stream ended mid-line, with no end line
    assert cut == kept.read_bytes(), "the rest read once, from where the stream ended"
    assert ends == [(3, Ending(3))]
    assert attached == [(9, 0)]
    assert answer.read_text() == f"delivered {len(cut)} 0\n"
    answer.unlink()
    whole, ends = read(["sh", "-c", f"cat '{kept}'; {tell}"])
    assert whole == kept.read_bytes() and ends == [(3, Ending(3))]
    assert attached == [], "not attached again"
    assert answer.read_text() == f"delivered {len(whole)} 0\n"


def test_an_older_guard_that_refuses_the_end_line_is_said_once_and_not_attached_again() -> None:
    """A lab brought up by an older tflab: its guard refuses `--end-in-stream` (argparse's usage, exit 2). The run is
    told to `tflab up`, at once: no attach again (which it would refuse too)."""
    import subprocess
    import threading

    from tflab.engine.attached import OLD_GUARD, Reattach
    from tflab.engine.executors import _SshProcess

    refusal = ("usage: tflab-guard [-h]\n                   {run,serve,attach,delivered,hold,holders,standby,warm,"
               "version,probe,alive,ended,metrics,stop,program}\n                   ...\ntflab-guard: error: "
               "unrecognized arguments: --end-in-stream\n")  # the guard of protocol 3, asked to run with the end line
    attached: list[tuple[int, int]] = []

    def start_child(argv, env=None, workdir="/"):
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def attach(out: int, err: int) -> list[str]:
        attached.append((out, err))
        return ["sh", "-c", "exit 2"]

    process = _SshProcess(start_child(["sh", "-c", f"printf '%s' '{refusal}' >&2; exit 2"]), start_child,
                          resume=Reattach(attach))
    ends: list = []
    done = threading.Event()
    threading.Thread(target=process.pump, args=(lambda _chunk, _err: None, lambda end: (ends.append(end), done.set())),
                     daemon=True).start()
    assert done.wait(10)
    assert [(end.code, end.reason) for end in ends] == [(2, OLD_GUARD)] and attached == []


def test_a_dropped_reader_takes_the_ending_without_the_rest_of_the_output(tmp_path) -> None:
    """`tflab exec worker0 -- yes | head -1`: head has its line, so tflab says `drop` (then `stop`). The guard's end
    line says the node kept far more than came through: nobody will read it, so tflab does not attach again for it
    (it did, five times, each one a copy of gigabytes of `y`)."""
    import subprocess
    import threading

    from tflab_guard.protocol import Ending, StreamEnd

    from tflab.engine.attached import Reattach
    from tflab.engine.executors import _SshProcess

    end_line = tmp_path / "end"
    end_line.write_bytes(StreamEnd(Ending(143, "SIGTERM", "stopped"), [10 ** 9, 0]).line())
    heard = tmp_path / "heard"
    script = (f"echo y; read first; read second; echo \"$first $second\" > '{heard}'; cat '{end_line}'; "
              f"cat '{end_line}' >&2; exit 143")
    attached: list[tuple[int, int]] = []

    def attach(out: int, err: int) -> list[str]:
        attached.append((out, err))
        return ["true"]

    child = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    process = _SshProcess(child, lambda argv: subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                               stderr=subprocess.PIPE),
                          resume=Reattach(attach))
    ends: list[Ending | None] = []
    done = threading.Event()

    def head_has_its_line(chunk: bytes, _is_err: bool) -> None:  # as CommandRun does once stdout is closed
        if chunk == b"y\n":
            process.drop()
            process.close()

    threading.Thread(target=process.pump, args=(head_has_its_line, lambda end: (ends.append(end.ending), done.set())),
                     daemon=True).start()
    assert done.wait(10)
    assert heard.read_text() == "drop stop\n", "the guard was told its reader is gone, then to stop"
    assert ends == [Ending(143, "SIGTERM", "stopped")] and attached == [], "its ending, with no attach for the rest"
