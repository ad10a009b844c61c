"""The exec path's connection, on public APIs only: what the SDK hands back is read-only for unix engines."""

from __future__ import annotations

import socket

from tflab.engine.executors import GO, STOP, writable


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
